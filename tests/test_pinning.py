"""Pinning the one enrolled server (or key holder) happens in one function, with one error.

Before, each party wrote its own "exactly one enrolled server" check with its
own exception (and so its own exit code); a copy that forgets the count check
trusts whichever identity comes first. Every party now asks
:func:`secure_afl.pki.pinned_identity`.
"""

from __future__ import annotations

import ast

import pytest

from secure_afl import pki
from secure_afl.exceptions import MissingEnrolment
from support import sourcetree as st

PKI_PACKAGE = "secure_afl.pki"
PINNING = "secure_afl.pki.roster.pinned_identity"


def _enrolment_lookups_by_role(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "load_enrolments":
            for kw in node.keywords:
                if kw.arg == "role" and isinstance(kw.value, ast.Constant):
                    yield node.lineno, kw.value.value


def test_no_module_pins_the_server_by_itself():
    offences = [f"{m.path.relative_to(st.REPO)}:{line}" for m in st.modules().values()
                if not (m.name == PKI_PACKAGE or m.name.startswith(PKI_PACKAGE + "."))
                for line, role in _enrolment_lookups_by_role(m.tree()) if role == "server"]
    assert not offences, "server identity looked up outside pki.pinned_identity:\n" + "\n".join(offences)


def test_one_pinning_function():
    defs = [f"{m.name}.{n.name}" for m in st.modules().values() for n in ast.walk(m.tree())
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and "pinned" in n.name.lower()
            and not n.name.startswith("test_")]
    assert defs == [PINNING], defs


def test_an_unpinnable_role_raises_the_one_error(tmp_path):
    pki.init_ca(tmp_path / "pki")
    for name in ("s1", "s2"):
        pki.issue(tmp_path / "pki", "server", name)
    with pytest.raises(MissingEnrolment):
        pki.pinned_identity(tmp_path / "pki", "server")  # two servers: which one?
    with pytest.raises(MissingEnrolment):
        pki.pinned_identity(tmp_path / "pki", "keyholder")  # none
    one = pki.pinned_identity(tmp_path / "pki", "server", "s2")
    assert pki.public_key_hex(one) == pki.public_key_hex(pki.load_party(tmp_path / "pki", "server", "s2").identity_pub())
