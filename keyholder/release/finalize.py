"""The key holder role: verify, re-sum, decrypt once, flood, check, restore and solve.

Runs on: a machine of a party that does not collude with the server. Sees:
the CKKS secret key (ckks), the hospitals' signed uploads (ciphertexts it
re-sums itself), the server-signed manifest, and the flooded aggregate of at
least ``min_clients`` hospitals: never one hospital's statistics. Produces the
model W and a report.

Stages (``secure-afl keyholder ...``, see ``cli.py``): ``keygen`` (fresh keys
and the keygen record, ``custody.py``), ``publish`` (public context, tag key
and the key holder's signature over the parameters), ``finalize`` (close,
verify and re-sum, ``verify.py``; decrypt once; flood, ``flooding.py``;
sanity-check, tag check, class minimum, RI restoration, solve).
"""

from __future__ import annotations

from secure_afl.backends import HE_BACKENDS
from secure_afl.cohort import release_policy
from secure_afl.params import KEYED_BACKENDS

from .common import FinalResult, HTTPSource
from .he import HERelease
from .reveal import RevealRelease
from .split_share import SplitRelease


class KeyHolder(HERelease, SplitRelease, RevealRelease):
    """Key custody and release for one consortium key holder identity.

    Parameters
    ----------
    pki_dir : path
        Consortium PKI directory (CA, this key holder's files, enrolments).
    name : str
        This key holder's enrolled name.
    keys_dir : path
        Where per-session key files, keygen records and the release ledger live (0700).
    passphrase : bytes, optional
        Protects the secret contexts at rest; default: $SECURE_AFL_KEY_PASSPHRASE.
    """

    def finalize(self, conn, *, min_clients: int, lam: float = 0.0, min_class_count: int = 1,
                 expected_hospitals: list[str] | None = None) -> FinalResult:
        """Close (if needed), fetch, verify, reveal, check, restore and solve.

        The release policy is the stricter of this key holder's and the session's
        (``min_clients``, ``min_class_count``): the server cannot relax it.
        """
        from secure_afl.session.relay import check_same
        from secure_afl.session.signed import load_signed

        # the operator's signed definition, not the server's info, says what this session is: its backend,
        # its release policy and (plain, secagg) its parameters; ckks and bfv use this key holder's keygen record
        definition = load_signed(self.pki_dir, conn.session_id)
        # the sealed key is opened before anything changes state (the round closed, the key recorded as used):
        # a mistyped passphrase then leaves the session as it was, and the command can simply be rerun
        # (split: once per process; a judge that opened it while the session was open hands it on)
        secret = None
        if definition.backend in KEYED_BACKENDS:
            secret = (self.opened_split_secret(conn.session_id) if definition.backend == "split" else None) \
                or self.secret_context(conn.session_id)
        info = conn.info()
        # the session's own floor, from the signed definition only; this key holder's may only raise it
        policy = release_policy(definition, min_clients=min_clients, min_class_count=min_class_count)
        min_clients, min_class_count = policy.min_clients, policy.min_class_count
        if info["status"] != "released":
            self.close_round(conn)
            info = conn.info()
        self.countersign_audit_head(conn, conn.request("GET", conn.path("/manifest")).json())
        if definition.backend == "split":
            return self.finalize_split(conn, min_clients=min_clients, expected_hospitals=expected_hospitals,
                                       secret=secret, lam=lam, min_class_count=min_class_count)
        if definition.backend in HE_BACKENDS:
            return self.release_he(conn.session_id, HTTPSource(conn), min_clients=min_clients, lam=lam,
                                   min_class_count=min_class_count, expected_hospitals=expected_hospitals,
                                   secret=secret)
        params = definition.session_params()
        check_same(params.to_dict(), info.get("params") or {}, what="params.", source="the server")
        aggregate = conn.request("GET", conn.path("/aggregate")).content
        manifest = conn.request("GET", conn.path("/manifest")).json()
        unmask = None
        if params.backend == "secagg":
            unmask = conn.request("GET", conn.path("/secagg/unmask-material")).json()
        return self.reveal_and_solve(params, aggregate, manifest, min_clients=min_clients, lam=lam,
                                     min_class_count=min_class_count, expected_hospitals=expected_hospitals,
                                     unmask=unmask)

