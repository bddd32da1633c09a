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

:class:`KeyHolder` keeps the keys (``custody.py``), the split judges of the sessions it is judging, and the
online stages; each release is one :class:`~.session_release.SessionRelease` (policy, trust set, opened key)
handed to its backend's path: ``he.release_he``, ``split_share.release_split`` then
``split_share.keep_commitment`` and ``split_share.release_from_sum``, ``reveal.reveal_and_solve``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from secure_afl import pki
from secure_afl.audit_log import countersign_head
from secure_afl.backends import HE_BACKENDS
from secure_afl.encoding import canonical_json
from secure_afl.exceptions import DecryptionRefused, InvalidInputError, SecureAFLError
from secure_afl.keyholder_params import sign_session_params
from secure_afl.params import KEYED_BACKENDS, SessionParams
from secure_afl.protocol import context_publication
from secure_afl.tagging import TAG_KEY_PARAM

from ..connection import KeyHolderConnection
from ..custody import KeyCustody
from . import he, reveal, split_share
from .common import FinalResult, HTTPSource
from .session_release import SessionRelease, open_release, signed_policy, trust_set


class KeyHolder(KeyCustody):
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

    def __init__(self, pki_dir, name: str, keys_dir, *, passphrase: bytes | None = None):
        super().__init__(pki_dir, name, keys_dir, passphrase=passphrase)
        #: (session id, sorted expected hospitals or None) -> its split judge
        #: (:class:`secure_afl.keyholder.split_stream.SplitJudge`), kept between passes: its seed key is unsealed
        #: (a passphrase KDF run) once, not at every poll, and the release forms its share from its verdicts
        self.split_judges: dict[tuple[str, tuple[str, ...] | None], object] = {}

    # -- the release -------------------------------------------------------------------------------------------
    def open_release(self, session_id: str, *, min_clients: int, min_class_count: int = 0,
                     expected_hospitals: list[str] | None = None, params: SessionParams | None = None,
                     unseal: bool = True, secret: bytes | None = None) -> SessionRelease:
        """The release of ``session_id`` (:func:`~.session_release.open_release`); split: the seed key a judge
        in this process has opened already is handed on (the passphrase KDF runs once, not twice)."""
        if secret is None and unseal:
            secret = self.opened_split_secret(session_id)
        return open_release(self, session_id, min_clients=min_clients, min_class_count=min_class_count,
                            expected_hospitals=expected_hospitals, params=params, unseal=unseal, secret=secret)

    def finalize(self, conn, *, min_clients: int, lam: float = 0.0, min_class_count: int = 1,
                 expected_hospitals: list[str] | None = None, announce=None) -> FinalResult:
        """Close (if needed), countersign the audit head, then release by the session's backend: fetch, verify,
        reveal, check, restore and solve.

        The release policy is the stricter of this key holder's and the session's
        (``min_clients``, ``min_class_count``): the server cannot relax it. This key holder's own floor is
        checked against the uploads accepted so far before the round is closed, so a refusal on its side leaves
        the session open. ``announce(n)`` is called just before the close, once nothing local can refuse.
        """
        from secure_afl.session.relay import check_same
        from secure_afl.session.signed import load_signed

        # the operator's signed definition, not the server's info, says what this session is: its backend,
        # its release policy and (plain, secagg) its parameters; ckks, bfv and split use this key holder's
        # keygen record
        definition = load_signed(self.pki_dir, conn.session_id)
        keyed = definition.backend in KEYED_BACKENDS
        # policy, trust set and the opened key, before anything changes state (the round closed, the key
        # recorded as used): a mistyped passphrase leaves the session as it was, and the command can be rerun
        rel = self.open_release(conn.session_id, min_clients=min_clients, min_class_count=min_class_count,
                                expected_hospitals=expected_hospitals,
                                params=None if keyed else definition.session_params())
        # the session's own floors, from the signed definition only; this key holder's may only raise them
        min_class_count = rel.policy.min_class_count
        # the upload count from the signed status view: the public info carries none (any consortium client
        # polling it would date every upload)
        view = conn.status()
        uploaded = len(view["uploaded"])
        if view["status"] != "released":
            self._check_floor(rel.policy, uploaded)
            if announce is not None:
                announce(uploaded)
            self.close_round(conn)
        elif announce is not None:
            announce(uploaded)
        info = conn.info()
        # before anything is decrypted: the auditor holds a head the server alone cannot rewrite
        self.countersign_audit_head(conn, conn.request("GET", conn.path("/manifest")).json())
        if definition.backend == "split":
            return split_share.finalize_split(rel, conn, self.split_judge(conn.session_id, expected_hospitals),
                                              lam=lam, min_class_count=min_class_count)
        if definition.backend in HE_BACKENDS:
            return he.release_he(rel, HTTPSource(conn), lam=lam, min_class_count=min_class_count)
        check_same(rel.params.to_dict(), info.get("params") or {}, what="params.", source="the server")
        aggregate = conn.request("GET", conn.path("/aggregate")).content
        manifest = conn.request("GET", conn.path("/manifest")).json()
        unmask = None
        if rel.params.backend == "secagg":
            unmask = conn.request("GET", conn.path("/secagg/unmask-material")).json()
        return reveal.reveal_and_solve(rel, aggregate, manifest, lam=lam, min_class_count=min_class_count,
                                       unmask=unmask)

    @staticmethod
    def _check_floor(policy, uploads: int) -> None:
        """:class:`InsufficientContributors` before the close when fewer uploads are in than this key holder's
        own floor asks: the server would otherwise close the round at the signed quorum and the release be
        refused here, leaving a closed session with nothing released."""
        from secure_afl.exceptions import InsufficientContributors

        if uploads >= policy.quorum:
            return
        signed = max(policy.signed_min_clients, 1)
        from secure_afl.cohort import quorum as signed_quorum

        q = signed_quorum(len(policy.roster), policy.colluders, signed)
        if uploads >= q:
            how = (f"to release these {uploads} uploads, rerun with --min-clients {uploads} (the signed quorum is "
                   f"{q}); or wait for more uploads and rerun")
        else:
            how = f"wait until at least {policy.quorum} have uploaded and rerun"
        raise InsufficientContributors(
            f"not closing session {policy.session_id}: {uploads} uploads accepted, fewer than the release quorum "
            f"q = {policy.quorum} ({policy.why_quorum()}); the session stays open and takes further uploads: {how}")

    # -- each path's entry point, for a caller that drives one step itself (the Flower app, the tools) --------
    def release_he(self, sid: str, source, *, min_clients: int, lam: float = 0.0, min_class_count: int = 1,
                   expected_hospitals: list[str] | None = None, workers: int | None = None,
                   secret: bytes | None = None) -> FinalResult:
        """ckks, bfv: :func:`~.he.release_he` over ``source`` (its ``manifest()``, ``contribution(hospital)``
        and ``tags()``); ``secret``: the opened secret context, if the caller opened it already."""
        rel = self.open_release(sid, min_clients=min_clients, expected_hospitals=expected_hospitals, secret=secret)
        return he.release_he(rel, source, lam=lam, min_class_count=min_class_count, workers=workers)

    def reveal_and_solve(self, params: SessionParams, aggregate: bytes, manifest: dict, *, min_clients: int,
                         lam: float = 0.0, min_class_count: int = 1,
                         expected_hospitals: list[str] | None = None, unmask: dict | None = None) -> FinalResult:
        """plain / secagg: :func:`~.reveal.reveal_and_solve` of the server's ``aggregate`` under ``params``
        (the signed definition's); ckks and bfv are refused (their sum is re-summed from the signed uploads)."""
        rel = self.open_release(params.session_id, min_clients=min_clients, expected_hospitals=expected_hospitals,
                                params=params, unseal=False)
        return reveal.reveal_and_solve(rel, aggregate, manifest, lam=lam, min_class_count=min_class_count,
                                       unmask=unmask)

    def release_split(self, sid: str, source, *, min_clients: int, expected_hospitals: list[str] | None = None,
                      timings: dict | None = None, secret: bytes | None = None) -> tuple[bytes, dict]:
        """split: this key holder's share and signed statement (:func:`~.split_share.release_split`), from
        ``source``'s manifest and seed statements."""
        rel = self.open_release(sid, min_clients=min_clients, expected_hospitals=expected_hospitals, secret=secret)
        return split_share.release_split(rel, source, self.split_judge(sid, expected_hospitals), timings=timings)

    def finalize_split(self, conn, *, min_clients: int, expected_hospitals: list[str] | None = None,
                       secret: bytes | None = None, lam: float = 0.0, min_class_count: int = 1) -> FinalResult:
        """split, the round already closed: :func:`~.split_share.finalize_split`."""
        rel = self.open_release(conn.session_id, min_clients=min_clients, expected_hospitals=expected_hospitals,
                                secret=secret)
        return split_share.finalize_split(rel, conn, self.split_judge(conn.session_id, expected_hospitals),
                                          lam=lam, min_class_count=min_class_count)

    def commit_split_share(self, conn, *, min_clients: int, expected_hospitals: list[str] | None = None,
                           timings: dict | None = None, secret: bytes | None = None):
        """This key holder's share and signed statement (:meth:`release_split`) kept, the statement posted and the
        server's committed masked sum over it checked and kept (:func:`~.split_share.commit_split_share`); the
        share has not left."""
        rel = self.open_release(conn.session_id, min_clients=min_clients, expected_hospitals=expected_hospitals,
                                secret=secret)
        return split_share.commit_split_share(rel, conn, self.split_judge(conn.session_id, expected_hospitals),
                                              timings=timings)

    def send_split_share(self, conn) -> None:
        """The kept share, sent for the statement the server committed to (:func:`~.split_share.send_split_share`);
        refused if no commitment was kept."""
        rel = self.open_release(conn.session_id, min_clients=0, unseal=False)
        split_share.send_split_share(rel, conn, self._kept(rel))

    def keep_split_share(self, sid: str, body: bytes, statement: dict) -> None:
        """The share and statement :meth:`release_split` formed, kept until the server has committed its sum."""
        split_share.keep_share(self.open_release(sid, min_clients=0, unseal=False), body, statement)

    def take_commitment(self, sid: str, manifest: dict, answer) -> bytes:
        """split, the Flower path: the server's committed masked sum (relayed by the ServerApp) checked against
        this key holder's own kept statement and kept (:func:`~.split_share.keep_commitment`); returns the share
        to send, the ledger already counting it as gone."""
        rel = self.open_release(sid, min_clients=0, unseal=False)
        kept = split_share.kept_commitment(rel)
        if kept is None:
            body, statement = split_share.kept_share(rel)
            kept = split_share.keep_commitment(rel, manifest, body, statement, answer)
        else:  # a retry: only the kept sum is ever taken, and another one is the server's, refused by name
            split_share.check_same_commitment(rel, kept, answer)
        split_share.mark_share_sent(rel)
        return kept.share

    def release_kept(self, sid: str, *, lam: float = 0.0, min_class_count: int = 1) -> FinalResult:
        """split: the release from the kept commitment and share (:func:`~.split_share.release_from_sum`), never
        from a sum the server hands over after the share."""
        rel = self.open_release(sid, min_clients=0, unseal=False)
        k = self._kept(rel)
        return split_share.release_from_sum(rel, k.share, k.statement, k.signed, k.masked_sum, k.manifest, lam=lam,
                                            min_class_count=min_class_count)

    @staticmethod
    def _kept(rel):
        from secure_afl.exceptions import PolicyViolation

        kept = split_share.kept_commitment(rel)
        if kept is None:
            raise PolicyViolation(f"no masked sum of the server is kept for session {rel.session_id}: the share "
                                  "leaves only after the server committed to the sum", reason="no_commitment")
        return kept

    def refuse_server_sum(self, sid: str, err: Exception):
        """The server's masked sum refused, recorded against the session's seed key; returns the
        :class:`~secure_afl.keyholder.verify.ServerForgery` to raise."""
        return split_share.refuse_server_sum(self.keys_dir / "releases.sqlite3", self.params(sid), err)

    # -- split: the judges, while the session is open ------------------------------------------------------
    def judge_split(self, conn, *, expected_hospitals: list[str] | None = None) -> dict:
        """While a split session is open: judge every upload accepted so far and not judged yet (one pass;
        call it as often as uploads arrive). Returns hospital -> verdict (None: valid, else the failed check)."""
        from secure_afl.release_checks import ReleaseLedger

        judge = self.split_judge(conn.session_id, expected_hospitals)
        ledger = ReleaseLedger(self.keys_dir / "releases.sqlite3")
        try:
            ledger.check_unused(judge.key_id)
            records = judge.poll(HTTPSource(conn), ledger)
        finally:
            ledger.close()
        return {h: r["verdict"] for h, r in records.items()}

    def split_queries(self, sid: str, statements: dict) -> dict:
        """hospital -> ``{payload_sha256, query_seed}`` for each upload whose signed seed statement holds (the
        query a transport without a round trip per upload, such as Flower, carries to the server)."""
        return self.split_judge(sid, None).queries(statements)

    def split_judge(self, sid: str, expected_hospitals=None):
        """The session's judge for this trust set (:attr:`split_judges`), made at its first use."""
        from ..split_stream import SplitJudge

        k = (sid, None if expected_hospitals is None else tuple(sorted(expected_hospitals)))
        if k not in self.split_judges:
            self.split_judges[k] = SplitJudge(self, sid, expected_hospitals=expected_hospitals)
        return self.split_judges[k]

    def opened_split_secret(self, sid: str) -> bytes | None:
        """The session's seed key if a judge in this process has opened it already; else None."""
        for (s, _), judge in self.split_judges.items():
            if s == sid and judge.unlocked:
                return judge.secret()
        return None

    def trust(self, session_id: str, expected_hospitals=None) -> tuple[object, dict]:
        """``(server identity, hospital -> enrolled key)`` of the session's signed roster, from this PKI."""
        return trust_set(self.pki_dir, signed_policy(self.pki_dir, session_id, min_clients=1), expected_hospitals)

    # -- online stages -----------------------------------------------------------------------------------------
    def connect(self, server_url: str, session_id: str) -> KeyHolderConnection:
        return KeyHolderConnection(server_url, self.party, session_id)

    def publish(self, conn) -> dict:
        """Send the public context, the tag key and this key holder's signature over the parameters."""
        return conn.request("POST", conn.path("/context"), body=self.publication_body(conn.session_id)).json()

    def publication_body(self, session_id: str) -> bytes:
        """The publication any transport carries: public context, tag key, signature over the parameters."""
        params = self.params(session_id)
        return context_publication(self.public_context(session_id), params.backend_params[TAG_KEY_PARAM],
                                   sign_session_params(self.party.identity_key(), params))

    def close_round(self, conn) -> dict:
        return conn.request("POST", conn.path("/close")).json()

    def countersign_audit_head(self, conn, manifest: dict) -> dict:
        """Countersign the server's close record (audit seq + head of this release) and hand it back,
        before anything is decrypted: the auditor then holds a head the server alone cannot rewrite."""
        close = conn.request("GET", conn.path("/audit/head")).json()["close"]
        cs = self.countersign_close(close, manifest)
        self.keep_audit_head(conn.session_id, close, cs)
        return conn.request("POST", conn.path("/audit/countersign"), body=canonical_json(cs)).json()

    def audit_head_path(self, session_id: str) -> Path:
        return self.keys_dir / f"{session_id}.audit-head.json"

    def keep_audit_head(self, session_id: str, close: dict, countersign: dict) -> Path:
        """Keep the countersigned head here, before the server gets it: auditors take it from the key holder
        (with the model and report), so a server that withholds or replaces its own copy is noticed."""
        import re

        from secure_afl._io import write_file

        if not isinstance(session_id, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", session_id):
            raise InvalidInputError(f"not a session id: {session_id!r}")
        path = self.audit_head_path(session_id)
        tmp = path.with_suffix(".tmp")
        write_file(tmp, json.dumps({"close": close, "countersign": countersign}, indent=1, sort_keys=True).encode(),
                   mode=0o644, exclusive=False)
        os.replace(tmp, path)
        return path

    def countersign_close(self, close: dict, manifest: dict) -> dict:
        """The countersignature over ``close``, checked against the pinned server key and the manifest;
        :class:`DecryptionRefused` if it does not hold (nothing is decrypted then)."""
        try:
            return countersign_head(self.party.identity_key(), self.party.name, close,
                                    pki.pinned_identity(self.pki_dir, "server"), manifest)
        except (SecureAFLError, AttributeError, TypeError) as e:
            raise DecryptionRefused(f"not decrypting: the audit close record does not hold ({e})") from e
