"""split: the key holder judges each upload as it arrives, not all of them after the deadline.

For every upload the server has accepted (its hospital-signed seed statement,
``GET .../split/statements``) the key holder derives the upload's query seed
from its own query key and the signed commitment
(:func:`secure_afl.split.signed_messages.query_seed`), sends it (``POST .../split/queries``),
checks the server's signed verifier message against that seed, opens the
seed and decides. The verdict, the server's message behind it and the running
``-sum m_k`` of the accepted uploads' lane masks (sealed at rest) are kept in
the key directory, so the release only checks the cohort, opens the
manifest's seeds and starts its share from that sum. An upload not judged
before the release (or judged under another statement) is judged then, by the
same code: the verdicts do not depend on when they were formed.

Strictness is the release's: a server message that is forged, replayed or not
at this key holder's query seed blocks the key (:class:`ServerForgery`); while
the session is open, a seed statement that does not verify is left for the
release, which refuses it by name as before.
"""

from __future__ import annotations
import hashlib
import json
import os
from pathlib import Path
import numpy as np

from secure_afl import domains
from secure_afl._io import write_file
from secure_afl import split
from secure_afl.encoding import canonical_json
from secure_afl.exceptions import InvalidSignature, MalformedPayload, SecureAFLError
from secure_afl.hazmat.at_rest import open_secret, seal_secret

from .verify import ServerForgery

__all__ = ["POLL_S", "SplitJudge"]

#: Seconds between two judging passes while the session is open (``keyholder judge``'s default): the last upload
#: waits at most this long for its verdict before the release can start. A pass with nothing new is two small
#: requests.
POLL_S = 0.5


def _digest(statement) -> str:
    return hashlib.sha256(canonical_json(dict(statement))).hexdigest()


class SplitJudge:
    """One key holder's verdicts for one split session (``kh``: :class:`secure_afl.keyholder.KeyHolder`)."""

    def __init__(self, kh, session_id: str, *, expected_hospitals=None):
        self.kh, self.sid = kh, session_id
        self.params = kh.params(session_id)  # the keygen record, never the server's word
        self.key_id = self.params.backend_params[split.PUBLIC_CONTEXT_KEY]
        self.server_pub, self.enrolled = kh.trust(session_id, expected_hospitals)
        self.circuit = split.Circuit(self.params)
        self._secret: bytes | None = None
        self._seed_key = None
        self._read = 0  # seed statements read while the session is open (the server's arrival order)
        # this key holder's own processes (the opened seeds travel to them over pipes, nowhere else), started
        # once the session has enough uploads and kept between polls
        self.pool = split.pool.verifier_pool()

    # -- state in the key directory ---------------------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return self.kh.keys_dir / f"{self.sid}.split-verdicts.json"

    def unlock(self, secret: bytes) -> None:
        """Take the seed key the caller has already opened (and so checked), rather than opening it again."""
        if self._secret is None:
            self._secret = bytes(secret)

    def secret(self) -> bytes:
        """The sealed seed key, opened once per judge (each opening runs the passphrase KDF)."""
        if self._secret is None:
            self._secret = self.kh.secret_context(self.sid)
        return self._secret

    @property
    def unlocked(self) -> bool:
        return self._secret is not None

    def seed_key(self):
        """The HPKE private key the seed boxes open under, built once from :meth:`secret`."""
        if self._seed_key is None:
            self._seed_key = split.seed_private_key(self.secret())
        return self._seed_key

    def _sum_key(self) -> bytes:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF

        return HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                    info=domains.SPLIT_JUDGED_KEY).derive(self.secret())

    def _sum_ad(self, covered: dict) -> bytes:
        return domains.SPLIT_JUDGED_AD + canonical_json({"session_id": self.sid, "covered": covered})

    def _state(self) -> dict:
        return json.loads(self.state_path.read_text()) if self.state_path.exists() else {}

    def records(self) -> dict:
        """hospital -> {payload_sha256, statement_sha256, verdict (None or the failed check), server_message and
        keyholder_message (the server's signed verifier message and this key holder's own, kept for a
        refusal; None for an accepted upload)}."""
        return self._state().get("records", {})

    def judged(self, state: dict | None = None) -> tuple[dict, np.ndarray]:
        """``(hospital -> seed digest, -sum m_k)`` over the uploads judged valid so far (sealed at rest: one
        hospital's mask alone would unmask its upload)."""
        F, n = split.field_of(self.params), split.main_words(self.params)
        state = self._state() if state is None else state
        if "sum" not in state:
            return {}, F.zeros(n)
        covered = state["covered"]
        body = open_secret(bytes.fromhex(state["sum"]), associated_data=self._sum_ad(covered), key=self._sum_key())
        return covered, F.from_bytes(body, n, what="the judged sum")

    def _save(self, records: dict, covered: dict, total: np.ndarray) -> None:
        """One file, replaced whole: a reader (a release beside a judging loop) sees one state or the next."""
        sealed = seal_secret(split.field_of(self.params).to_bytes(total), associated_data=self._sum_ad(covered),
                             key=self._sum_key())
        tmp = self.state_path.with_name(self.state_path.name + f".{os.getpid()}.tmp")
        write_file(tmp, json.dumps({"records": records, "covered": covered, "sum": sealed.hex()},
                                   sort_keys=True).encode(), exclusive=False)
        os.replace(tmp, self.state_path)

    # -- judging ------------------------------------------------------------------------------------------
    def judge(self, source, uploads, ledger, *, strict: bool) -> dict:
        """Judge every ``(hospital, payload_sha256, seed statement)`` not yet judged under that statement.

        ``strict`` (the release): a statement or box that does not hold raises
        :class:`split.SeedRefused` naming the hospital. Otherwise (while the
        session is open) it is skipped and left to the release. A server message
        that does not hold blocks the key and raises :class:`ServerForgery`.
        Returns the records (:meth:`records`)."""
        state = self._state()  # one read: the records and the sum written below are these plus the new
        records = state.get("records", {})
        covered, total = self.judged(state)
        qkey = split.query_key(self.secret())
        todo = []
        for h, sha, st in uploads:
            rec = records.get(h)
            if isinstance(st, dict) and rec is not None and rec["statement_sha256"] == _digest(st) \
                    and rec["payload_sha256"] == sha:
                continue
            try:
                if h not in self.enrolled:
                    raise split.SeedRefused(f"{h} is not enrolled in this session", h)
                seed = split.open_statement_seed(self.params, self.seed_key(), {h: st}, self.enrolled, h, sha)
                qs = split.query_seed(qkey, self.params, h, sha, st.get("validity"))
            except SecureAFLError:
                if strict:
                    raise
                continue
            todo.append((h, sha, st, seed, qs))
        if not todo:
            return records
        answers = source.split_queries({h: {"payload_sha256": sha, "query_seed": qs.hex()}
                                        for h, sha, _, _, qs in todo})
        try:
            if not isinstance(answers, dict):
                raise InvalidSignature("the server's verifier messages are not a mapping")
            checked = [(h, seed, st.get("validity"), qs, split.verify_leader_message(
                answers.get(h), self.server_pub, self.circuit, h, sha, qs)[1]) for h, sha, st, seed, qs in todo]
        except SecureAFLError as e:
            ledger.block(self.key_id, f"refused before the share: {e}")
            raise ServerForgery(f"the server's verifier messages do not hold: {e}") from e
        own: dict = {}
        verdicts, partial = split.keyholder_verdicts(self.params, checked, pool=self.pool, messages=own)
        if any(h in covered for h, *_ in todo):
            # a hospital judged valid before under another statement: its mask is in the sum and cannot be
            # told apart; start the sum again (the release expands every mask the sum does not cover)
            covered, total = {}, np.zeros_like(total)
        total = split.field_of(self.params).add(total, partial)
        for h, sha, st, seed, qs in todo:
            if verdicts[h] is None:
                covered[h] = split.seed_digest(seed)
            # a refusal keeps this key holder's own verifier message: published beside the server's, the two
            # recompute the verdict (split.joint_verdict, in secure_afl.split.roles)
            # the server's message is kept only where it backs a refusal: about 12 kB per upload, and this
            # file is written again at every pass
            records[h] = {"payload_sha256": sha, "statement_sha256": _digest(st), "verdict": verdicts[h],
                          "server_message": answers[h] if verdicts[h] is not None else None,
                          "keyholder_message": own[h].hex() if h in own else None}
        self._save(records, covered, total)
        return records

    def queries(self, statements) -> dict:
        """hospital -> ``{payload_sha256, query_seed}`` for each seed statement that holds (others are left to
        the release, which refuses them by name)."""
        if not isinstance(statements, dict):
            raise MalformedPayload("the seed statements are not a mapping")
        qkey = split.query_key(self.secret())
        out = {}
        for h, st in sorted(statements.items()):
            if not isinstance(st, dict) or h not in self.enrolled or not isinstance(st.get("payload_sha256"), str):
                continue
            try:
                split.verify_seed_statement(st, self.enrolled[h], self.params, h, st["payload_sha256"])
                qs = split.query_seed(qkey, self.params, h, st["payload_sha256"], st.get("validity"))
            except SecureAFLError:
                continue
            out[h] = {"payload_sha256": st["payload_sha256"], "query_seed": qs.hex()}
        return out

    def poll(self, source, ledger) -> dict:
        """One streaming pass while the session is open: judge every upload accepted since the last pass (the
        server sends the statements after the ones this judge has read; what it leaves out, the release judges
        by name)."""
        statements = source.split_statements(after=self._read)
        if not isinstance(statements, dict):
            raise MalformedPayload("the server's seed statements are not a mapping")
        self._read += len(statements)
        uploads = [(h, st.get("payload_sha256"), st) for h, st in sorted(statements.items())
                   if isinstance(st, dict) and isinstance(st.get("payload_sha256"), str)]
        return self.judge(source, uploads, ledger, strict=False)
