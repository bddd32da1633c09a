import pytest

from secure_afl.cli import main

LEVELS = ["", "reproduce", "reproduce dummy", "bench", "bench protect", "bench extract", "bench service", "client", "client embed",
          "client submit", "client fingerprint", "pki", "pki init", "pki issue", "pki bundle", "audit",
          "audit verify", "server", "server run", "keyholder", "keyholder keygen", "keyholder publish",
          "keyholder finalize", "demo", "attack", "compare"]


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
