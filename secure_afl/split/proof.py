"""split's proof system, generic over the statement: an upload's body, its sharing, Fiat-Shamir, the verifiers'
messages and the decision (docs/VALIDITY.md).

With ``x`` the upload's 2L fixed-point lanes (``hi`` then ``lo``, centred integers carried in F_p,
p = 2^64 - 2^32 + 1) and ``b`` the prover's auxiliary bits (the statement's blocks,
:mod:`secure_afl.split.statements`), the verifiers accept iff every entry of ``b`` is a bit (the fully linear
proof of :class:`secure_afl.hazmat.flp.BitProof`, repeated ``REPS`` times, more where the bit vector is long
enough to need it for a soundness error below ``2^-SOUNDNESS_BITS``) and the statement's affine
relations hold in F_p, checked as ``LINEAR_REPS`` verifier-chosen random linear combinations (so only their
values, zero for a valid upload, are revealed). A statement may add words of its own after the lanes, proofs
of its own and a part of its own to each verifier's message (:class:`secure_afl.split.statements.Statement`);
this module names no statement: the session's is :func:`secure_afl.split.session_statement.statement_for`.

The projection rows ``r_j in {-1, 0, 1}^L`` (0 with probability 1/2) come from a hash of the committed
upload: ``<r_j, hi> + T = sum 2^i bp_(j,i)`` with ``T = 2^(m - 1)`` puts every row's projection of the high
lane in ``[-T, T)``. A high-lane entry with centred ``|x_i| > 2T`` keeps each row's projection out of
``[-T, T]`` with probability at least 1/2, so ``ROWS`` rows bound every entry by ``2T`` except with
probability ``2^-ROWS`` per hash query. ``T`` is ``TAIL`` times the l2 norm an honest lane cannot exceed
(an honest row leaves ``[-T, T)`` with probability below ``2 exp(-TAIL^2 / 2)``; the honest prover then draws
a fresh seed). The low lane is not range-proven, and need not be: the collector reads the low-lane sum
through its centred representative, below ``p/2 < 2^63`` whatever the uploads hold
(:func:`secure_afl.split.sizes.proven_aggregate_bound`).

Sharing: the hospital's fresh seed ``s`` gives ``m = expand_field(s)`` over the whole body
``w = x || factor || b || proofs``; the server holds ``w + m`` (the upload), the key holder ``-m`` (from the
seed it opens). Both shares are uniform alone.

Randomness is the caller's: :meth:`Circuit.prove_once` takes its seed and proof blinding as bytes
(:attr:`Circuit.rand_size`); :meth:`Circuit.prove` is the hospital software's loop that draws them.
"""

from __future__ import annotations

import hashlib
import math
import os
from typing import Mapping

import numpy as np

from .. import domains
from ..encoding import canonical_json
from ..envelope import open_envelope, sealed_size
from ..exceptions import BoundsExceeded, InvalidInputError, InvalidParameterError, MalformedPayload
from ..hazmat import field128_kernels, fixedpoint, flp
from ..hazmat.fields import canonical
from ..params import SessionParams
from . import projection
from .signed_messages import UploadCommitment, seed_digest, FS_PREFIX
from .sizes import LINEAR_REPS, MAX_REPS, REPS, RETRIES, ROWS, SOUNDNESS_BITS, field_of, fits, lanes_per_value, \
    proof_scale, statement_sizes
from .session_statement import statement_for
from .statements import PROOF_DOMAIN, VERDICTS, AFFINE, Prover, Shares, Unlucky, bits_of

__all__ = ["Circuit", "DOMAIN_SHARE", "soundness_bits", "describe"]

#: the whole body's mask stream (main vector, bits, proofs): its own ChaCha20 domain
DOMAIN_SHARE = domains.SPLIT_SHARE_XOF
_ROW_DOMAIN = domains.SPLIT_ROW_XOF
_SEED = 32


def _circuit_id(field_name: str, reps: int) -> bytes:
    """The field's name and the repetition count, as one prefix-free string (name, NUL, one byte)."""
    return field_name.encode("ascii") + b"\0" + bytes([reps])


class Circuit:
    """The validity statement of one session with its proof system: sizes, prover and verifier."""

    def __init__(self, params: SessionParams):
        self.params = params
        #: the field the whole circuit runs over, as the session's signed parameters name it
        self.F = field_of(params)
        if self.F.name != flp.GOLDILOCKS.name:
            # a session over Field128 multiplies millions of its elements per upload: its compiled loops, once
            # per process (numba's import, about a second, is paid where such a session is first met)
            field128_kernels.load()
        lay = params.layout
        #: the session's (f1, f2), the encoding secagg and bfv share
        self.frac_bits = tuple(int(v) for v in params.backend_params["frac_bits"])
        #: field words per value: 2 lanes in Goldilocks, one exact word in Field128 (sizes.lanes_per_value)
        self.lanes_per_value = lanes_per_value(params)
        # the statement reads its lanes at (f1, f2), or with one word at (f1 + f2, 0)
        f1, f2 = proof_scale(params, *self.frac_bits)
        why = fits(params, f1, f2)
        if why is not None:
            raise InvalidParameterError(f"frac_bits {list(self.frac_bits)} let a proven upload wrap ({why}); use "
                                        "secure_afl.split.sizes.choose_frac_bits")
        self.f1, self.f2 = f1, f2
        s = statement_sizes(params, f1, f2)
        self.sizes = s
        self.L = lay.length
        self.d, self.C = lay.dim, lay.n_classes
        #: the session's statement (one interface, :class:`secure_afl.split.statements.Statement`)
        self.statement = statement_for(params, s, f1, self.L)
        st = self.statement
        self.i_n, self.i_counts, self.i_contrib, self.i_tag, self.i_diag = \
            st.i_n, st.i_counts, st.i_contrib, st.i_tag, st.i_diag
        #: DP: the noise share's hard bound tau (grid units) the statement is widened by; 0 without DP
        self.dp = params.dp is not None
        self.tau = s["tau"]
        # bit blocks: (name, count, width)
        self.blocks = st.blocks()
        self.offsets = {}
        off = 0
        for name, cnt, width in self.blocks:
            self.offsets[name] = (off, cnt, width)
            off += cnt * width
        self.n_bits = off
        self.bits = flp.BitProof(self.n_bits, field=self.F)
        #: repetitions of the bit proof: REPS, or more where a long bit vector would leave the validity soundness
        #: error above 2^-SOUNDNESS_BITS (one more repetition multiplies its per-query term by |bits| / p)
        self.reps = REPS
        while soundness_bits(self) < SOUNDNESS_BITS and self.reps < MAX_REPS:
            self.reps += 1
        self.main_len = self.lanes_per_value * self.L
        # body: lanes (summed) | the statement's words | bits | bit proofs | the statement's proofs; the
        # commitment's main hash covers the lanes and those words
        self.n_f = st.n_words
        self.commit_len = self.main_len + self.n_f
        self.proof_len = self.reps * self.bits.proof_len + st.proof_len
        self.total = self.commit_len + self.n_bits + self.proof_len
        #: the projection threshold: every proven high-lane entry is within 2T
        self.T = 1 << (s["m_hi"] - 1)
        self.groups = st.relation_groups()
        self.n_relations = sum(cnt for _, cnt in self.groups)
        self.verifier_len = LINEAR_REPS + self.reps * self.bits.verifier_len + st.verifier_len
        #: bytes of randomness one proving try takes: the mask seed, then 32 per proof (bit proofs, then the
        #: statement's)
        self.rand_size = _SEED * (1 + self.reps + st.n_proofs)

    def upload_bytes(self) -> int:
        """The sealed payload's length: every upload of the session is exactly this long."""
        return sealed_size(self.params, "contribution", self.total * self.F.ENCODED_SIZE)

    def part(self, name: str):
        """The named part of the session's statement (None if the session does not carry it)."""
        return self.statement.part(name)

    def relation_names(self) -> list[str]:
        """Every relation the session's statement checks (its affine groups, the bits, and its own checks)."""
        return self.statement.relation_names()

    @staticmethod
    def verdict_of(relation: str) -> str:
        """The verdict an upload breaking just ``relation`` gets."""
        return VERDICTS.get(relation, AFFINE)

    # -- Fiat-Shamir --------------------------------------------------------------------------------------
    def fs_seed(self, hospital: str, main_sha256: str, seed_sha256: str) -> bytes:
        return hashlib.sha256(FS_PREFIX + canonical_json({
            "session_id": self.params.session_id, "params_digest": self.params.digest().hex(),
            "hospital": hospital, "main_sha256": main_sha256, "seed_sha256": seed_sha256})).digest()

    def joint_rand(self, fs: bytes, aux_sha256: str) -> list[int]:
        """The bit proofs' joint randomness, one per repetition. Its key binds the field's name and the number
        of repetitions (as Prio3 binds its algorithm and its number of proofs): a circuit with another count
        or over another field draws unrelated values, not a prefix of these."""
        key = hashlib.sha256(fs + domains.SPLIT_FS_JOINT + _circuit_id(self.F.name, self.reps) +
                             bytes.fromhex(aux_sha256)).digest()
        return [int(v) for v in self.F.to_ints(self.F.expand_field(key, self.reps, domains.SPLIT_JOINT_XOF))]

    def query_rand(self, fs: bytes, aux_sha256: str, query_seed: bytes) -> tuple[list[int], np.ndarray]:
        """Query points (off the FLP domain) and the linear-check coefficients, from the verifiers' seed."""
        if not isinstance(query_seed, (bytes, bytearray)) or len(query_seed) != 32:
            raise MalformedPayload("a query seed is 32 bytes")
        key = hashlib.sha256(domains.SPLIT_QUERY_RAND + _circuit_id(self.F.name, self.reps) + bytes(query_seed) +
                             fs + bytes.fromhex(aux_sha256)).digest()
        r = self.reps
        stream = self.F.expand_field(key, 4 * r + LINEAR_REPS * self.n_relations, domains.SPLIT_QUERY_XOF)
        pts = [int(v) for v in self.F.to_ints(stream[:4 * r]) if pow(int(v), self.bits.n, self.F.P) != 1][:r]
        if len(pts) < r:  # pragma: no cover - probability about (N/p)^(3 reps)
            raise InvalidInputError("query points fell on the interpolation domain; draw another query seed")
        return pts, stream[4 * r:].reshape(LINEAR_REPS, self.n_relations)

    def project(self, x, fs: bytes) -> np.ndarray:
        """``<r_j, hi> mod p`` for the ROWS rows, shape (ROWS,)."""
        hi = np.asarray(x, dtype=self.F.dtype)[:self.L]
        return projection.project(hi, hashlib.sha256(fs + domains.SPLIT_FS_ROWS).digest(), _ROW_DOMAIN,
                                  compiled=True, field=self.F)

    # -- prover ------------------------------------------------------------------------------------------
    def lanes(self, vector) -> np.ndarray:
        """Fixed-point lanes of a packed float64 vector as field elements: the 2L lanes secagg sums, or with
        one word per value the L integers ``hi 2^f2 + lo`` (exact in the field: secagg's lane sums, combined)."""
        words = fixedpoint.encode(np.asarray(vector, dtype=np.float64), self.frac_bits).view(np.int64)
        if self.lanes_per_value == 2:
            return self.F.encode_signed(words)
        return self.F.add(self.F.scale(self.F.encode_signed(words[:self.L]), 1 << self.frac_bits[1]),
                          self.F.encode_signed(words[self.L:]))

    _bits_of = staticmethod(bits_of)

    def _hi_ints(self, x: np.ndarray) -> dict:
        """The centred high lane of n, the counts and the diagonal, as Python integers (what the bits encode)."""
        idx = np.concatenate([[self.i_n], self.i_counts, self.i_diag])
        return dict(zip(idx.tolist(), (int(v) for v in self.F.decode_signed(x[idx]))))

    def witness_values(self, x: np.ndarray, fs: bytes, *, check: bool, factor=None) -> dict:
        """Block name -> the prover's values for lanes ``x`` (and factor words ``factor``) under Fiat-Shamir seed
        ``fs``; with ``check``, :class:`BoundsExceeded` if the statistics break the statement and
        :class:`Unlucky` if a projection leaves its honest range."""
        x = np.asarray(x, dtype=self.F.dtype)
        hi = self._hi_ints(x)
        # one word per value has no low lane: it reads as zero where a statement checks one
        lo = (self.F.decode_signed(x[self.L:]) if self.lanes_per_value == 2 else [0] * self.L) if check else None
        words = self.F.zeros(self.n_f) if factor is None else np.asarray(factor, dtype=self.F.dtype)
        values = self.statement.witness(Prover(hi, lo, words, fs), check=check)
        proj = [int(v) + self.T for v in self.F.decode_signed(self.project(x, fs))]
        if check and not all(0 <= v < 2 * self.T for v in proj):
            raise Unlucky()
        values["proj"] = proj
        return values

    def bits_from(self, values: dict) -> np.ndarray:
        """The auxiliary bits of block values (each wrapped modulo its width, as an unchecked prover would)."""
        return np.concatenate([bits_of(values[name], width, self.F) for name, _, width in self.blocks])

    def _aux(self, x: np.ndarray, fs: bytes, *, check: bool, factor=None) -> np.ndarray:
        return self.bits_from(self.witness_values(x, fs, check=check, factor=factor))

    def aux_bits(self, x: np.ndarray, fs: bytes, factor=None) -> np.ndarray:
        """The auxiliary bits for lanes ``x`` (and, under the Gram statement, factor words ``factor``) under
        Fiat-Shamir seed ``fs``, unchecked (values outside a range wrap modulo its width): the starting point
        of the attack commands and of the verifiers' tests."""
        return self._aux(np.asarray(x, dtype=self.F.dtype), fs, check=False, factor=factor)

    def witness(self, vector=None, *, lanes=None, factor=None, noise=None) -> tuple[np.ndarray, np.ndarray]:
        """``(lanes, words)`` an upload proves: what the statement uploads for the vector (its lanes, or under the
        Gram statement the statistics snapped onto ``2^t L L^T`` and the factor, docs/VALIDITY.md), or the given
        raw field ``lanes``. Under DP with the Gram statement, ``vector`` is the statistics before the noise and
        ``noise`` the share."""
        up = self.statement.upload(self.lanes, vector, noise) if lanes is None else None
        if up is not None:
            x, factor = up
        else:
            x = self.lanes(vector) if lanes is None else np.asarray(lanes, dtype=self.F.dtype)
        if x.shape != (self.main_len,):
            raise MalformedPayload(f"the lane vector is not {self.lanes_per_value}L field elements")
        x = canonical(self.F, x, "the lane vector")
        fw = self.F.zeros(self.n_f) if factor is None else np.asarray(factor, dtype=self.F.dtype)
        if fw.shape != (self.n_f,):
            raise MalformedPayload("the factor is not the session's number of field elements")
        fw = canonical(self.F, fw, "the factor")
        return x, fw

    def prove_once(self, hospital: str, x: np.ndarray, fw: np.ndarray, rand: bytes, *, check: bool = True,
                   aux_override=None) -> tuple[np.ndarray, bytes, UploadCommitment]:
        """One try: ``(masked body w + m, seed, commitment)`` for lanes ``x`` and factor words ``fw``
        (:meth:`witness`) with the caller's ``rand`` (:attr:`rand_size` bytes: the mask seed, then each
        proof's blinding). :class:`Unlucky` if this seed's projection rows leave an honest range."""
        rand = bytes(rand)
        if len(rand) != self.rand_size:
            raise InvalidInputError(f"a proving try takes {self.rand_size} bytes of randomness")
        s = rand[:_SEED]
        blind = [rand[i:i + _SEED] for i in range(_SEED, len(rand), _SEED)]
        c0, c1 = self.commit_len, self.commit_len + self.n_bits
        F = self.F
        mask = F.expand_field(s, self.total, DOMAIN_SHARE)
        y_main = F.add(np.concatenate([x, fw]), mask[:c0])
        main_sha = hashlib.sha256(F.to_bytes(y_main)).hexdigest()
        seed_sha = seed_digest(s)
        fs = self.fs_seed(hospital, main_sha, seed_sha)
        aux = self._aux(x, fs, check=check, factor=fw) if aux_override is None else aux_override(self, x, fs)
        y_aux = F.add(aux, mask[c0:c1])
        aux_sha = hashlib.sha256(F.to_bytes(y_aux)).hexdigest()
        jrs = self.joint_rand(fs, aux_sha)
        proofs = self.bits.prove_reps(aux, jrs, [F.expand_field(r, 2 * self.bits.chunk, PROOF_DOMAIN)
                                                 for r in blind[:self.reps]])
        proofs += self.statement.prove(fw, fs, aux_sha, blind[self.reps:])
        y_proof = F.add(np.concatenate(proofs), mask[c1:])
        body = np.concatenate([y_main, y_aux, y_proof])
        return body, s, UploadCommitment(main_sha, aux_sha, seed_sha)

    def prove(self, hospital: str, vector=None, *, lanes=None, seed: bytes | None = None, check: bool = True,
              aux_override=None, factor=None, noise=None,
              randbytes=os.urandom) -> tuple[np.ndarray, bytes, UploadCommitment]:
        """The hospital software's loop around :meth:`prove_once`: fresh randomness from ``randbytes`` per try
        (and the projection retried, docs/VALIDITY.md) unless ``seed`` fixes the mask seed.

        ``check=False`` and ``lanes``/``aux_override`` build an upload whose statement is false (the attack
        commands and the tests of the verifiers use them); an honest hospital never sets them."""
        x, fw = self.witness(vector, lanes=lanes, factor=factor, noise=noise)
        for _ in range(RETRIES):
            rand = randbytes(self.rand_size) if seed is None else bytes(seed) + randbytes(self.rand_size - _SEED)
            try:
                return self.prove_once(hospital, x, fw, rand, check=check, aux_override=aux_override)
            except Unlucky:
                if seed is not None:
                    raise
        raise BoundsExceeded(f"{RETRIES} fresh seeds all drew projection rows outside the honest range: "
                             "the vector is not within the declared l2 bound")

    # -- verifiers -----------------------------------------------------------------------------------------
    def leader_share(self, body: bytes | np.ndarray) -> np.ndarray:
        """Server: the upload's words as its share (length-checked, every word a field element)."""
        if isinstance(body, (bytes, bytearray, memoryview)):
            return self.F.from_bytes(bytes(body), self.total, what="the split upload")
        body = np.asarray(body, dtype=self.F.dtype)
        if body.shape != (self.total,):
            raise MalformedPayload("the split upload is not the session's number of field elements")
        return canonical(self.F, body, "the split upload")

    def upload_share(self, payload: bytes, *, accepted: bool = False) -> np.ndarray:
        """Server: a sealed upload's words as its share (the envelope opened and checked for this session;
        ``accepted``: :func:`secure_afl.envelope.peek_header`)."""
        return self.leader_share(open_envelope(self.params, payload, "contribution", accepted=accepted).body)

    def helper_share(self, seed: bytes) -> np.ndarray:
        """Key holder: ``-m`` from the opened seed."""
        return self.F.neg(self.F.expand_field(seed, self.total, DOMAIN_SHARE))

    def check_commitment(self, share: np.ndarray, commitment: UploadCommitment, *, leader: bool,
                         seed: bytes | None = None) -> None:
        """Leader: the hashes are of its words; helper: ``seed_sha256`` is of the opened seed."""
        if leader:
            if hashlib.sha256(self.F.to_bytes(share[:self.commit_len])).hexdigest() != commitment.main_sha256 or \
                    hashlib.sha256(self.F.to_bytes(share[self.commit_len:self.commit_len + self.n_bits])).hexdigest() \
                    != commitment.aux_sha256:
                raise MalformedPayload("the validity commitment does not match the uploaded words")
        elif seed is None or seed_digest(seed) != commitment.seed_sha256:
            raise MalformedPayload("the validity commitment does not match the sealed seed")

    def _decompose(self, bits: np.ndarray, name: str) -> np.ndarray:
        off, cnt, width = self.offsets[name]
        blk = bits[off:off + cnt * width].reshape(cnt, width)
        w = self.F.to_field([1 << j for j in range(width)])
        return self.F.sum_mod(self.F.mul(blk, w), axis=1)

    def _parts(self, share: np.ndarray):
        """``(bits, bit proofs, the statement's words, the statement's proofs)`` of a share (or plain body)."""
        bits = share[self.commit_len:self.commit_len + self.n_bits]
        off = self.commit_len + self.n_bits
        k = self.reps * self.bits.proof_len
        proofs = share[off:off + k].reshape(self.reps, self.bits.proof_len)
        return bits, proofs, share[self.main_len:self.commit_len], share[off + k:]

    def _view(self, share: np.ndarray, fs: bytes, aux_sha256: str, *, leader: bool) -> Shares:
        x = share[:self.main_len]
        bits, _, words, own = self._parts(share)
        one = 1 if leader else 0

        def dec(name):
            return self._decompose(bits, name)

        def proj():
            return self.F.sub(self.F.add(self.project(x, fs), self.F.to_field([self.T * one])), dec("proj"))

        return Shares(x, self.L, dec, leader, proj, field=self.F, words=words, proofs=own, fs=fs, aux_sha256=aux_sha256)

    def relation_values(self, share: np.ndarray, fs: bytes, *, leader: bool) -> list[np.ndarray]:
        """This verifier's shares of each relation group's values (:meth:`Statement.relation_groups`)."""
        groups = self.statement.relations(self._view(share, fs, "", leader=leader))
        if [len(g) for g in groups] != [cnt for _, cnt in self.groups]:  # pragma: no cover - a layout slip
            raise AssertionError("relation count")
        return groups

    def relations(self, share: np.ndarray, fs: bytes, *, leader: bool) -> np.ndarray:
        """This verifier's shares of every affine relation's value (all zero on an honest upload)."""
        return np.concatenate(self.relation_values(share, fs, leader=leader))

    def query(self, share: np.ndarray, commitment: UploadCommitment, hospital: str, query_seed: bytes, *,
              leader: bool) -> np.ndarray:
        """One verifier's message: ``[linear combination of the relations] ++ reps bit-proof queries ++ the
        statement's own part`` (:meth:`Statement.query`)."""
        fs = self.fs_seed(hospital, commitment.main_sha256, commitment.seed_sha256)
        pts, coeffs = self.query_rand(fs, commitment.aux_sha256, query_seed)
        view = self._view(share, fs, commitment.aux_sha256, leader=leader)
        rel = np.concatenate(self.statement.relations(view))
        bits, proofs, _, _ = self._parts(share)
        msgs = [self.F.to_field([self.F.dot(row, rel) for row in coeffs])]
        for jr, t, pf in zip(self.joint_rand(fs, commitment.aux_sha256), pts, proofs):
            msgs.append(self.bits.query(bits, pf, jr, t, leader=leader))
        msgs.append(self.statement.query(view, query_seed))
        return np.concatenate(msgs)

    def decide(self, leader_msg, helper_msg) -> str | None:
        """None if the upload is valid, else which check failed (``linear``, ``bits``, or the statement's own
        verdict, e.g. ``gram_range``, ``gram``, ``noise``)."""
        a = np.asarray(leader_msg, dtype=self.F.dtype)
        b = np.asarray(helper_msg, dtype=self.F.dtype)
        if a.shape != (self.verifier_len,) or b.shape != (self.verifier_len,):
            raise MalformedPayload("a verifier message has the wrong shape")
        a = canonical(self.F, a, "a verifier message")
        b = canonical(self.F, b, "a verifier message")
        v = self.F.add(a, b)
        if any(int(z) for z in self.F.to_ints(v[:LINEAR_REPS])):
            return AFFINE
        k, o = self.bits.verifier_len, LINEAR_REPS
        for r in range(self.reps):
            if not self.bits.decide(v[o + r * k:o + (r + 1) * k]):
                return "bits"
        return self.statement.decide(v[o + self.reps * k:])

    # -- the unshared circuit -------------------------------------------------------------------------------
    def evaluate(self, body: np.ndarray, commitment: UploadCommitment, hospital: str) -> list[str]:
        """The relations an UNMASKED body ``w`` breaks (empty: valid), evaluated on the plain words rather
        than through shares and queries: what the two verifiers' messages decide, without their soundness
        error. For tests and the vectors only; no party ever holds ``w``."""
        w = np.asarray(body, dtype=self.F.dtype)
        fs = self.fs_seed(hospital, commitment.main_sha256, commitment.seed_sha256)
        failed = [name for (name, _), vals in zip(self.groups, self.relation_values(w, fs, leader=True))
                  if np.any(self.F.to_ints(vals) != 0)]
        bits, _, _, _ = self._parts(w)
        if any(int(b) > 1 for b in self.F.to_ints(bits)):
            failed.append("bits")
        return failed + self.statement.failures(self._view(w, fs, commitment.aux_sha256, leader=True))


def soundness_bits(circuit: Circuit, hash_queries_log2: int = 64) -> float:
    """-log2 of the bound on accepting an invalid upload, for a prover making 2^q hash queries (docs/VALIDITY.md):
    the projection rows and the bit proof's terms, and the statement's own (:meth:`Statement.soundness`)."""
    q = 2.0 ** hash_queries_log2
    p = float(circuit.F.P)
    bp = circuit.bits
    own_query, own_point, pairs = circuit.statement.soundness()
    per_query = 2.0 ** -ROWS + (bp.length / p) ** circuit.reps + own_query
    query_point = ((2 * bp.n - 2) / (p - bp.n)) ** circuit.reps + own_point
    linear = (1.0 / p) ** LINEAR_REPS * pairs
    return -math.log2(q * per_query + query_point + linear)


def describe(circuit: Circuit) -> Mapping:
    """Sizes for the docs and the benchmark."""
    return {"L": circuit.L, "main_words": circuit.main_len, "aux_bits": circuit.n_bits,
            "proof_words": circuit.proof_len, "verifier_words": circuit.verifier_len,
            "chunk": circuit.bits.chunk, "domain": circuit.bits.n, "frac_bits": list(circuit.frac_bits),
            "lanes_per_value": circuit.lanes_per_value, "proof_scale": [circuit.f1, circuit.f2],
            "T_hi_log2": circuit.sizes["m_hi"] - 1, **circuit.statement.describe(),
            "bit_proof_reps": circuit.reps, "soundness_bits_q64": round(soundness_bits(circuit), 1)}
