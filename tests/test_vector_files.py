"""The generated vector files (vectors/split/, vectors/secagg/, vectors/field128.json): the documented command
regenerates every one of them byte for byte, with no file missing or extra in either direction, and the one
loader (secure_afl_tools.vectors.files) refuses a file of another version by name.

What the files mean is checked elsewhere: tests/test_split_vectors.py and tests/test_secagg_vectors.py replay
each case against the real verifiers, tests/test_vector_semantics.py recomputes the recorded derivations."""

from __future__ import annotations

import json
import shutil

import pytest

from secure_afl.exceptions import InvalidInputError
from secure_afl_tools.vectors import GENERATORS, KEPT, files, generator
from secure_afl_tools.vectors.command import main, owned

PROTOCOLS = ["split", "secagg"]


@pytest.mark.parametrize("name", list(GENERATORS))
def test_the_command_regenerates_the_shipped_files_byte_for_byte(name, tmp_path):
    assert main([name, "--out", str(tmp_path)]) == 0
    gen = generator(name)
    written, shipped = set(owned(tmp_path, gen.OWNS)), set(owned(files.ROOT, gen.OWNS))
    assert written, f"{name} wrote nothing"
    assert sorted(shipped - written) == [], "shipped, but no longer generated"
    assert sorted(written - shipped) == [], "generated, but not shipped"
    for rel in sorted(written):
        assert (tmp_path / rel).read_bytes() == (files.ROOT / rel).read_bytes(), f"{rel} differs"


def test_every_file_of_vectors_is_a_generators_or_kept_by_name():
    owners = [generator(n).OWNS for n in GENERATORS]
    assert sorted(p.name for p in files.ROOT.iterdir()) == sorted(owners + list(KEPT))


def test_check_names_a_file_the_generator_no_longer_writes(tmp_path, capsys):
    assert main(["secagg", "--out", str(tmp_path)]) == 0
    assert main(["secagg", "--out", str(tmp_path), "--check"]) == 0
    stray = tmp_path / "secagg" / f"{files.BAD}renamed_case.json"
    stray.write_text("{}\n")
    capsys.readouterr()
    assert main(["secagg", "--out", str(tmp_path), "--check"]) == 1
    assert f"{stray}: no longer generated" in capsys.readouterr().out
    # writing does not delete it either (this run did not write it), and still says so
    assert main(["secagg", "--out", str(tmp_path)]) == 1 and stray.exists()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_each_instance_lists_its_bad_cases_and_every_bad_case_is_listed_once(protocol):
    names = files.instances(protocol)
    assert names
    listed = []
    for name in names:
        inst = files.instance(protocol, name)
        assert (inst["protocol"], inst["instance"]) == (protocol, name)
        cases = files.bad_cases(protocol, name)
        assert [c["name"] for c in cases] == inst["bad_cases"]
        assert all(c["mutation"] and c["expect"] for c in cases)
        listed += inst["bad_cases"]
    on_disk = [p.stem[len(files.BAD):] for p in (files.ROOT / protocol).glob(f"{files.BAD}*.json")]
    assert sorted(listed) == sorted(on_disk) and len(set(listed)) == len(listed)


def _copy_with(tmp_path, protocol: str, filename: str, **changes) -> None:
    shutil.copytree(files.ROOT / protocol, tmp_path / protocol)
    path = tmp_path / protocol / filename
    path.write_text(files.render({**json.loads(path.read_text()), **changes}))


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("step", [-1, 1])
def test_an_instance_of_another_version_is_refused_by_name(protocol, step, tmp_path):
    name = files.instances(protocol)[0]
    current = files.VERSIONS[protocol]
    assert files.instance(protocol, name)["version"] == current
    _copy_with(tmp_path, protocol, f"{name}.json", version=current + step)
    with pytest.raises(InvalidInputError, match=rf"{name}\.json is version {current + step} of the {protocol} "
                                                rf"vectors; this tree reads version {current}"):
        files.instance(protocol, name, tmp_path)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_bad_case_of_another_version_is_refused_by_name(protocol, tmp_path):
    name = files.instances(protocol)[0]
    case = files.instance(protocol, name)["bad_cases"][-1]
    _copy_with(tmp_path, protocol, f"{files.BAD}{case}.json", version=files.VERSIONS[protocol] + 1)
    with pytest.raises(InvalidInputError, match=rf"{files.BAD}{case}\.json is version"):
        files.bad_cases(protocol, name, tmp_path)


def test_a_bad_case_listed_by_an_instance_it_does_not_mutate_is_refused(tmp_path):
    gram_case = files.instance("split", "gram")["bad_cases"][0]
    plain = files.instance("split", "plain")
    _copy_with(tmp_path, "split", "plain.json", bad_cases=plain["bad_cases"] + [gram_case])
    with pytest.raises(InvalidInputError, match=rf"{files.BAD}{gram_case}\.json mutates the split instance 'gram', "
                                                "not 'plain'"):
        files.bad_cases("split", "plain", tmp_path)
