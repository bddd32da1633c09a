import sys

import pytest

from secure_afl.cli import main

LEVELS = ["", "reproduce", "reproduce dummy", "bench", "bench protect", "bench extract", "bench service", "client", "client embed",
          "client submit", "client fingerprint", "pki", "pki init", "pki issue", "pki bundle", "audit",
          "audit verify", "server", "server run", "keyholder", "keyholder keygen", "keyholder publish",
          "keyholder finalize", "demo", "attack", "compare", "bench upload-cost", "client weights", "predict"]


@pytest.mark.parametrize("words", LEVELS)
def test_help_on_every_level(words, capsys):
    with pytest.raises(SystemExit) as e:
        main(words.split() + ["--help"])
    assert e.value.code == 0
    assert "usage: secure-afl" in capsys.readouterr().out


def test_unknown_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["frobnicate"])
    assert e.value.code == 2


@pytest.mark.parametrize("missing, extra", [("torch", "embed"), ("torchvision", "embed")])
def test_a_command_whose_extra_is_missing_names_the_extra(missing, extra, tmp_path, monkeypatch, capsys):
    # Prepare: an installation without the extra (`make demo` installs none); valid images
    import numpy as np

    np.savez(tmp_path / "images.npz", images=np.zeros((2, 8, 8, 3), np.uint8), y=np.array([0, 1]))
    for name in list(sys.modules):
        if name.partition(".")[0] == missing:
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, missing, None)  # import raises ModuleNotFoundError, as when not installed

    # Execute
    rc = main(["client", "embed", "--backbone", "resnet18", "--weights", "random", "--seed", "0", "--npz",
               str(tmp_path / "images.npz"), "--out", str(tmp_path / "e.npz")])

    # Assert: a usage error naming what to install, not a traceback
    err = capsys.readouterr().err
    assert rc == 3 and f"pip install 'secure-afl[{extra}]'" in err and missing in err
    assert err.strip() == (f"secure-afl: error [missing_extra]: this command needs {missing}, which the "
                           f"'{extra}' extra installs: pip install 'secure-afl[{extra}]'")
