"""secagg messages, stage by stage: canonical JSON on the wire, parsed strictly, each declared by one field
table (:mod:`secure_afl.secagg.wire`).

The wire bytes are pinned by vectors/secagg/ (tests/test_secagg_vectors.py, tests/test_vector_files.py).
"""

from __future__ import annotations

import functools
import hashlib
from typing import Mapping


from .. import domains
from ..envelope import peek_header
from ..exceptions import MalformedPayload
from ..hazmat.shamir import Share
from ..encoding import canonical_json
from .masking import deal_challenge, on_check_polynomial, share_commitment
from .settings import Stage
from .wire import (parse_message_json, STR, INT, ROUND, KEY, NONCE, DIGEST, SIGNATURE, BLOB, Field, MessageBase, Codec, FieldElementCodec, IdsCodec, IntMapCodec, ListCodec, NestedCodec, REGISTRY, Record, RowCodec, declare, message_fields)

__all__ = [
    "SetupRequest", "SetupAck", "AdvertiseKeysRequest", "KeyAdvertisement", "ShareKeysRequest", "EncryptedShare",
    "ShareKeysResponse", "MaskedInputRequest", "MaskedInput", "ConsistencyStatement", "UnmaskRequest",
    "UnmaskResponse", "UnmaskMaterial", "DealRecord", "DealerComplaint", "decode_message", "survivors_digest",
]


def decode_message(data) -> MessageBase:
    """Parse any secagg message from bytes or a dict (masked inputs: the sealed envelope bytes)."""
    if isinstance(data, (bytes, bytearray, memoryview)) and bytes(data[:8]) == domains.PAYLOAD_MAGIC:
        return MaskedInput.from_bytes(bytes(data))
    d = data if isinstance(data, Mapping) else parse_message_json(data)
    cls = REGISTRY.get(d.get("type")) if isinstance(d, Mapping) else None
    if cls is None:
        raise MalformedPayload("unknown secagg message type")
    return cls.from_dict(d)


# -- the messages, stage by stage --------------------------------------------------------------------------------
@message_fields(Field("params_digest", STR))
class SetupRequest(MessageBase):
    """Server -> hospital: join ``session_id`` as ``client_id`` under parameters ``params_digest``."""

    TYPE = "secagg.setup_request"
    STAGE = Stage.SETUP


@message_fields(Field("params_digest", STR))
class SetupAck(MessageBase):
    """Hospital -> server: parameters checked, ready."""

    TYPE = "secagg.setup_ack"
    STAGE = Stage.SETUP


@message_fields()
class AdvertiseKeysRequest(MessageBase):
    """Server -> hospital: send your two public keys."""

    TYPE = "secagg.advertise_keys_request"
    STAGE = Stage.ADVERTISE_KEYS


@message_fields(Field("params_digest", STR), Field("enc_public_key", KEY), Field("mask_public_key", KEY),
          Field("signature", SIGNATURE, signed=False, default=b""))
class KeyAdvertisement(MessageBase):
    """Hospital -> server (relayed to everybody): ``c_u^PK`` (share encryption), ``s_u^PK`` (masks).

    Signed with the hospital's enrolled Ed25519 identity key over the session
    parameters' digest and both keys, so a relayed advertisement cannot be
    swapped and the list of them can seed the neighbour graph.
    """

    TYPE = "secagg.key_advertisement"
    STAGE = Stage.ADVERTISE_KEYS
    SIGNING_PREFIX = domains.SECAGG_KEY_ADVERTISEMENT


class _RelayedAdvertisements(Field):
    """Each advertisement as ``[client_id, c^PK, s^PK, signature]``: its session, round and parameter digest are
    the request's, stated once (the request's ``params_digest``), which halves the O(K) part of the request."""

    _ROW = RowCodec(INT, KEY, KEY, SIGNATURE)

    def put(self, obj, out):
        ads = obj.advertisements
        digests = {a.params_digest for a in ads}
        if any((a.session_id, a.round) != (obj.session_id, obj.round) for a in ads) or len(digests) > 1:
            raise ValueError("relayed advertisements must belong to the request's session and round")
        out["params_digest"] = digests.pop() if digests else ""
        out["advertisements"] = [self._ROW.enc((a.client_id, a.enc_public_key, a.mask_public_key, a.signature))
                                 for a in ads]

    def take(self, d):
        rows = ListCodec(self._ROW).dec(d["advertisements"])
        sid, digest, r = STR.dec(d["session_id"]), STR.dec(d["params_digest"]), ROUND.dec(d["round"])
        return tuple(KeyAdvertisement(sid, cid, digest, c, s, sig, round=r) for cid, c, s, sig in rows)


@message_fields(_RelayedAdvertisements("advertisements", Codec()), Field("graph_seed", DIGEST))
class ShareKeysRequest(MessageBase):
    """Server -> hospital: every signed advertisement it received (U1) and the graph seed it claims.

    The hospital recomputes the seed from the advertisements and refuses a
    different one (:func:`~secure_afl.secagg.settings.graph_seed`).
    """

    TYPE = "secagg.share_keys_request"
    STAGE = Stage.SHARE_KEYS


@declare(Field("sender", INT), Field("recipient", INT), Field("nonce", NONCE), Field("ciphertext", BLOB),
          Field("commit_b", DIGEST), Field("commit_s", DIGEST))
class EncryptedShare(Record):
    """``ChaCha20Poly1305(k_uv, nonce, share(b_u)_v || share(s_u^SK)_v, ad(session, u -> v))``.

    ``commit_b`` / ``commit_s`` are the dealer's SHA-256 commitments to the two
    shares (:func:`~secure_afl.secagg.masking.share_commitment`), sent in the
    clear: the holder checks them against what it decrypts, the server checks
    every share revealed at unmasking against them and discards a wrong one.
    """

    WHAT = "share"


def _sorted_holders(rows) -> bool:
    holders = [h for h, *_ in rows]
    return holders == sorted(set(holders))


@declare(Field("session_id", STR), Field("round", ROUND), Field("params_digest", STR), Field("dealer", INT),
          Field("commitments", ListCodec(RowCodec(INT, DIGEST, DIGEST, DIGEST), _sorted_holders,
                                     "commitments are sorted by holder, one per holder")),
          Field("check", ListCodec(FieldElementCodec())), Field("signature", SIGNATURE, signed=False, default=b""))
class DealRecord(Record):
    """A dealer's signed account of its dealing: every holder's commitments and the check polynomial ``z``.

    ``commitments`` holds ``(holder, commit_b, commit_s, commit_r)`` for each share holder (the dealer
    included), sorted by holder; ``check`` the t coefficients of ``z = r + c_1 f_b + c_2 f_s``
    (:func:`~secure_afl.secagg.masking.on_check_polynomial`). The dealer signs it with its identity key, so a
    holder whose shares match their commitments but miss ``z`` holds a proof against the dealer that anyone
    can check (:class:`DealerComplaint`), and a server cannot invent one.
    """

    WHAT = "deal record"
    SIGNING_PREFIX = domains.SECAGG_DEAL

    @property
    def holders(self) -> tuple[int, ...]:
        return tuple(h for h, *_ in self.commitments)

    def commitment(self, holder: int) -> tuple[bytes, bytes, bytes] | None:
        for h, cb, cs, cr in self.commitments:
            if h == holder:
                return cb, cs, cr
        return None

    @property
    def weights(self) -> tuple[int, int]:
        return deal_challenge(self.session_id, self.params_digest, self.dealer, self.commitments, round=self.round)


@message_fields(Field("shares", ListCodec(NestedCodec("EncryptedShare"))), Field("own_commit_b", DIGEST),
          Field("own_commit_s", DIGEST), Field("deal", NestedCodec("DealRecord"), default=None))
class ShareKeysResponse(MessageBase):
    """Hospital -> server: one encrypted share pair per other share holder, for relaying.

    ``own_commit_b`` / ``own_commit_s`` commit to the shares the hospital keeps
    for itself (it reveals one of them at unmasking like any holder). ``deal``
    is required on the wire: ``None`` only stands for "not dealt yet" in memory.
    """

    TYPE = "secagg.share_keys_response"
    STAGE = Stage.SHARE_KEYS


@message_fields(Field("shares", ListCodec(NestedCodec("EncryptedShare"))),
          Field("deals", ListCodec(NestedCodec("DealRecord")), default=()))
class MaskedInputRequest(MessageBase):
    """Server -> hospital: the encrypted shares addressed to it by holders that completed SHARE_KEYS (U2).

    ``deals`` are the signed deal records of their dealers, one per share.
    """

    TYPE = "secagg.masked_input_request"
    STAGE = Stage.MASKED_INPUT


@message_fields(Field("payload", BLOB))
class MaskedInput(MessageBase):
    """Hospital -> server: the sealed masked vector ``y_u``.

    ``to_bytes`` is the sealed envelope itself (binary, 8 L bytes of body);
    ``to_dict`` carries it base64-encoded.
    """

    TYPE = "secagg.masked_input"
    STAGE = Stage.MASKED_INPUT

    def to_bytes(self) -> bytes:
        return self.payload

    @classmethod
    def from_bytes(cls, data: bytes) -> "MaskedInput":
        env = peek_header(data)
        cid, sid = env.header.get("client_id"), env.header.get("session_id")
        if isinstance(cid, bool) or not isinstance(cid, int) or not isinstance(sid, str):
            raise MalformedPayload("masked input header lacks client_id/session_id")
        if env.header.get("stage") != Stage.MASKED_INPUT:
            raise MalformedPayload("not a masked input payload")
        try:
            r = ROUND.dec(env.header["round"])
        except (KeyError, ValueError):
            raise MalformedPayload("masked input header lacks its round") from None
        return cls(sid, cid, bytes(data), r)


@message_fields(Field("deal", NestedCodec("DealRecord")), Field("share_b", BLOB), Field("share_s", BLOB),
          Field("share_r", BLOB))
class DealerComplaint(MessageBase):
    """Holder -> server, instead of its masked input: "dealer ``deal.dealer`` dealt me shares that miss ``z``".

    Carries the dealer's signed :class:`DealRecord` and the holder's three shares of that dealing. It proves
    the dealer cheated when (:meth:`proves`) the record carries the dealer's signature, the three shares match
    the holder's commitments in it, and they miss the check polynomial. Revealing the shares costs nothing:
    they are shares of a cheater's secrets. Nothing in it needs the holder's or the server's word.
    """

    TYPE = "secagg.dealer_complaint"
    STAGE = Stage.MASKED_INPUT

    def proves(self, dealer_identity_public_key, params_digest: str, threshold: int) -> bool:
        """True iff this is a transferable proof that the dealer dealt this holder shares off its own ``z``."""
        dl, u = self.deal, self.client_id
        if (dl.session_id, dl.round, dl.params_digest) != (self.session_id, self.round, params_digest):
            return False
        if len(dl.check) != threshold or not dl.verify(dealer_identity_public_key):
            return False
        committed = dl.commitment(u)
        if committed is None or u == dl.dealer:
            return False
        try:
            shares = [Share.from_bytes(x) for x in (self.share_b, self.share_s, self.share_r)]
        except (MalformedPayload, TypeError):
            return False
        if any(sh.index != u or sh.threshold != threshold for sh in shares):
            return False
        for kind, raw, commit in zip("bsr", (self.share_b, self.share_s, self.share_r), committed):
            if share_commitment(dl.session_id, dl.params_digest, kind, dl.dealer, u, raw, round=dl.round) != commit:
                return False
        b, s, r = (sh.value for sh in shares)
        return not on_check_polynomial(dl.check, dl.weights, u, b, s, r)


@message_fields(Field("params_digest", STR), Field("graph_seed", DIGEST),
          Field("survivors", IdsCodec(increasing=True), signed=False),
          Field("signature", SIGNATURE, signed=False, default=b""))
class ConsistencyStatement(MessageBase):
    """Survivor -> server (relayed to every survivor): "I saw exactly this survivor set".

    Bonawitz et al.'s consistency check. Signed with the hospital's identity
    key over the session, round, parameters' digest, the graph seed (hence
    the advertised set U1), the number of survivors and the SHA-256 of the
    sorted survivor ids (:func:`survivors_digest`): by collision resistance a
    signature over the digest is a signature over the set, and checking q of
    them costs q short messages instead of q copies of the set (signing the
    list itself made each check O(n), O(n^2) per hospital; the prefix changed
    with the signed form so a signature over the old form never verifies).
    """

    TYPE = "secagg.consistency"
    STAGE = Stage.UNMASK
    SIGNING_PREFIX = domains.SECAGG_CONSISTENCY

    def _derived(self) -> dict:
        return {"n_survivors": len(self.survivors), "survivors_sha256": survivors_digest(self.survivors).hex()}


@functools.lru_cache(maxsize=8)
def survivors_digest(survivors: tuple[int, ...]) -> bytes:
    """SHA-256 of the canonical JSON of the sorted survivor ids: what a consistency statement signs.

    Cached because every statement of a round is over the same set: a hospital checking q of them, and the
    server receiving n, hash the list once.
    """
    return hashlib.sha256(canonical_json(list(survivors))).digest()


class _RelayedStatements(Field):
    """Every statement a hospital accepts is over the set it signed itself, so the set, digest, seed and round
    travel once and each statement as ``[signer, signature]``: O(K) bytes instead of O(K^2). ``null`` for none."""

    _SIGNER = RowCodec(INT, SIGNATURE)

    def put(self, obj, out):
        st = obj.statements
        if len({(s.session_id, s.params_digest, s.graph_seed, s.survivors, s.round) for s in st}) > 1:
            raise ValueError("an unmask request relays statements over one survivor set")
        signed = None
        if st:
            s0 = st[0]
            signed = {"session_id": s0.session_id, "params_digest": s0.params_digest,
                      "graph_seed": DIGEST.enc(s0.graph_seed), "survivors": list(s0.survivors), "round": s0.round,
                      "signers": [self._SIGNER.enc((s.client_id, s.signature)) for s in st]}
        out["statements"] = signed

    def take(self, d):
        st = d["statements"]
        if st is None:
            return ()
        if not isinstance(st, Mapping):
            raise ValueError("must be an object with a signers list")
        # the shared part is parsed once: q statements over one set cost q signatures, not q survivor lists
        seed, surv = DIGEST.dec(st["graph_seed"]), IdsCodec(increasing=True).dec(st["survivors"])
        sid, digest, r = STR.dec(st["session_id"]), STR.dec(st["params_digest"]), ROUND.dec(st["round"])
        signers = ListCodec(self._SIGNER).dec(st["signers"])
        return tuple(ConsistencyStatement(sid, cid, digest, seed, surv, sig, r) for cid, sig in signers)


@message_fields(Field("survivors", IdsCodec()), Field("dropped", IdsCodec()),
          _RelayedStatements("statements", Codec(), default=()))
class UnmaskRequest(MessageBase):
    """Server -> surviving hospital: reveal b-shares of ``survivors`` and key-shares of ``dropped``.

    ``statements`` are the survivors' signed consistency statements: the
    hospital answers only when a quorum of them signed the set it signed.
    """

    TYPE = "secagg.unmask_request"
    STAGE = Stage.UNMASK


@message_fields(Field("self_mask_shares", IntMapCodec(BLOB)), Field("mask_key_shares", IntMapCodec(BLOB)))
class UnmaskResponse(MessageBase):
    """Hospital -> server: ``{owner: share bytes}`` for the self-mask seeds and the mask keys asked for."""

    TYPE = "secagg.unmask_response"
    STAGE = Stage.UNMASK


@declare(Field("survivors", IdsCodec()), Field("dropped", IdsCodec()), Field("self_mask_seeds", IntMapCodec(BLOB)),
          Field("dropped_mask_keys", IntMapCodec(BLOB)),
          Field("mask_public_keys", IntMapCodec(BLOB), default_factory=dict, optional=True),
          Field("graph_seed", BLOB, default=b""), Field("round", ROUND, default=1), frozen=False)
class UnmaskMaterial(Record):
    """What the server reconstructed: enough to remove every mask from the survivors' sum, nothing more.

    ``self_mask_seeds[u]`` for u in survivors, ``dropped_mask_keys[v]`` (raw
    X25519 private key) for v in dropped, ``mask_public_keys`` of the
    survivors that masked with a dropped hospital, and the ``graph_seed`` that
    says who masked with whom.
    """

    WHAT = "unmask material"
