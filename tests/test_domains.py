"""The registry of domain-separation strings (secure_afl/domains.py) is complete and unambiguous.

Two signatures of different kinds under the same key must never share a
prefix, or one could be presented as the other; a module that spells its own
prefix out of the registry escapes this check, so the tree is searched for
such literals too.
"""

from __future__ import annotations

import ast
import re

from secure_afl import domains
from support import sourcetree as st

REGISTRY = st.modules()["secure_afl.domains"].path


def _as_bytes(v) -> bytes:
    return v if isinstance(v, bytes) else v.encode()


def test_every_domain_string_is_distinct():
    values = [_as_bytes(v) for v in domains.ALL.values()]
    assert len(values) == len(set(values))


def test_no_signature_prefix_is_a_prefix_of_another():
    # every signing key signs under several of these: PREFIX || message must parse back to one kind
    values = [_as_bytes(v) for v in domains.SIGNATURES.values()]
    clashes = [(a, b) for a in values for b in values if a != b and b.startswith(a)]
    assert not clashes, clashes


def test_no_sub_label_of_one_seed_is_a_prefix_of_another():
    # SHA-256(seed || LABEL || ...) for several values from one seed: each must parse back to one label
    values = list(domains.SUB_LABELS.values())
    assert all(v.endswith(b"\0") and v.count(b"\0") == 1 for v in values)
    assert not [(a, b) for a in values for b in values if a != b and b.startswith(a)]


def test_every_signature_prefix_ends_with_a_separator():
    # without the terminator "secure-afl/x/v1" || "0..." and "secure-afl/x/v10" || "..." would be the same bytes
    assert all(v.endswith(b"\0") for v in domains.SIGNATURES.values())


def _literals(tree: ast.AST):
    skip = st.docstring_nodes(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)) and id(node) not in skip:
            yield node.lineno, _as_bytes(node.value)


# Case-insensitive: the keystream tags are spelt "saflSELFmask", the magics "SAFLPAY1", the signing prefixes
# "secure-afl/...". A tag is "safl" and letters or digits (a temporary directory's "safl-seal-" is no tag).
_TAG = re.compile(rb"(?i)safl[a-z0-9]")


# a sub-label: a short lower-case word ended by NUL, hashed after a seed ("rows\0", "factor-rows\0")
_SUB_LABEL = re.compile(rb"[a-z][a-z0-9-]*\0")


def _looks_like_a_domain(value: bytes) -> bool:
    low = value.lower()
    return (low.startswith(b"secure-afl/") or bool(_TAG.match(value)) or bool(_SUB_LABEL.fullmatch(value))
            or any(low.startswith(_as_bytes(v).lower()) for v in domains.ALL.values()))


def test_every_keystream_domain_is_a_distinct_chacha20_nonce():
    # hazmat.prg and hazmat.flp use the tag as the 12-byte ChaCha20 nonce: any other length is refused there
    values = list(domains.XOF.values())
    assert all(isinstance(v, bytes) and len(v) == 12 for v in values)
    assert len({v.lower() for v in values}) == len(values)


def test_no_module_but_the_registry_spells_a_domain_string():
    offences = [f"{m.path.relative_to(st.REPO)}:{line}: {value[:50]!r}"
                for m in st.modules().values() if m.path != REGISTRY
                for line, value in _literals(m.tree()) if _looks_like_a_domain(value)]
    assert not offences, "domain strings outside secure_afl/domains.py:\n" + "\n".join(offences)


def test_the_search_covers_every_party_package():
    scanned = {m.name.split(".")[1] for m in st.modules().values() if m.name.startswith("secure_afl.")}
    assert {"server", "keyholder", "clients", "flower", "consortium", "hazmat", "backends"} <= scanned
    assert any(m.name.startswith("secure_afl_tools.") for m in st.modules().values())  # the tools' distribution


def test_the_literal_search_sees_a_planted_prefix():
    planted = ast.parse('"""doc: secure-afl/x/v1 is fine here"""\nX = b"secure-afl/planted/v1\\0"\n'
                        'Y = b"saflPLANTtag"\nZ = b"SaflOther"\nW = "Secure-AFL/Mixed/v1"\n'
                        'T = "safl-seal-"\nH = "x-safl-tag"\nR = b"planted-rows\\0"\nN = b"\\0"\n')
    assert [v for _, v in _literals(planted) if _looks_like_a_domain(v)] == [
        b"secure-afl/planted/v1\0", b"saflPLANTtag", b"SaflOther", b"Secure-AFL/Mixed/v1", b"planted-rows\0"]
