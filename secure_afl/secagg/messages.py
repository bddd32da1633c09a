"""secagg messages: canonical JSON on the wire, parsed strictly."""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Mapping

from cryptography.exceptions import InvalidSignature

from .. import domains
from ..envelope import peek_header
from ..exceptions import MalformedPayload
from ..hazmat.shamir import PRIME, Share
from ..encoding import canonical_json, parse_json
from .masking import deal_challenge, on_check_polynomial, share_commitment
from .settings import Stage

__all__ = [
    "SetupRequest", "SetupAck", "AdvertiseKeysRequest", "KeyAdvertisement", "ShareKeysRequest", "EncryptedShare",
    "ShareKeysResponse", "MaskedInputRequest", "MaskedInput", "ConsistencyStatement", "UnmaskRequest",
    "UnmaskResponse", "UnmaskMaterial", "DealRecord", "DealerComplaint", "decode_message",
]

_KEY_BYTES = 32
_NONCE_BYTES = 12
_DIGEST_BYTES = 32
_SIG_BYTES = 64
_AD_PREFIX = domains.SECAGG_KEY_ADVERTISEMENT
# The statement signs the SHA-256 of the survivor list, not the list: a hospital checks q statements over one
# set, and signing the list itself made each check hash ~4.5 B per survivor (O(n) per signature, O(n^2) per
# hospital). The name changed with the signed form so a signature over the old form never verifies.
_CONSISTENCY_PREFIX = domains.SECAGG_CONSISTENCY
_DEAL_PREFIX = domains.SECAGG_DEAL
_VALUE_BYTES = 66  # one element of GF(2^521 - 1)


def _canonical(d: Mapping) -> bytes:
    return canonical_json(d)


def _verify(public_key, signature: bytes, data: bytes) -> bool:
    try:
        public_key.verify(signature, data)
    except (InvalidSignature, TypeError, ValueError):
        return False
    return True

def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(s) -> bytes:
    if not isinstance(s, str):
        raise ValueError("expected base64 text")
    return base64.b64decode(s.encode("ascii"), validate=True)


def _int(d: Mapping, key: str) -> int:
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{key} must be an int")
    return v


def _str(d: Mapping, key: str) -> str:
    v = d[key]
    if not isinstance(v, str):
        raise ValueError(f"{key} must be a string")
    return v


def _round(d: Mapping) -> int:
    r = _int(d, "round")
    if not 1 <= r <= 0xFFFF:
        raise ValueError("round out of range")
    return r


def _ids(v) -> tuple[int, ...]:
    if not isinstance(v, list) or any(isinstance(x, bool) or not isinstance(x, int) for x in v):
        raise ValueError("expected a list of ints")
    return tuple(v)


_REGISTRY: dict[str, type] = {}


class MessageBase:
    """Base: JSON-safe ``to_dict``/``from_dict`` and canonical-JSON ``to_bytes``/``from_bytes``."""

    TYPE: ClassVar[str]
    STAGE: ClassVar[str]
    session_id: str
    client_id: int
    round: int

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        _REGISTRY[cls.TYPE] = cls

    def _body(self) -> dict:
        raise NotImplementedError

    @classmethod
    def _parse(cls, d: Mapping) -> "MessageBase":
        raise NotImplementedError

    def to_dict(self) -> dict:
        d = {"type": self.TYPE, "stage": self.STAGE, "session_id": self.session_id, "client_id": self.client_id,
             "round": self.round}
        d.update(self._body())
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "MessageBase":
        if not isinstance(d, Mapping) or d.get("type") != cls.TYPE or d.get("stage") != cls.STAGE:
            raise MalformedPayload(f"not a {cls.TYPE} message")
        try:
            return replace(cls._parse(d), round=_round(d))
        except (KeyError, TypeError, ValueError, binascii.Error, AttributeError):
            raise MalformedPayload(f"malformed {cls.TYPE} message") from None

    def to_bytes(self) -> bytes:
        return canonical_json(self.to_dict())

    @classmethod
    def from_bytes(cls, data: bytes) -> "MessageBase":
        return cls.from_dict(_json(data))


def _json(data) -> Any:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError("message must be bytes")
    return parse_json(data, "secagg message")


def decode_message(data) -> MessageBase:
    """Parse any secagg message from bytes or a dict (masked inputs: the sealed envelope bytes)."""
    if isinstance(data, (bytes, bytearray, memoryview)) and bytes(data[:8]) == domains.PAYLOAD_MAGIC:
        return MaskedInput.from_bytes(bytes(data))
    d = data if isinstance(data, Mapping) else _json(data)
    cls = _REGISTRY.get(d.get("type")) if isinstance(d, Mapping) else None
    if cls is None:
        raise MalformedPayload("unknown secagg message type")
    return cls.from_dict(d)


@dataclass(frozen=True)
class SetupRequest(MessageBase):
    """Server -> hospital: join ``session_id`` as ``client_id`` under parameters ``params_digest``."""

    TYPE: ClassVar[str] = "secagg.setup_request"
    STAGE: ClassVar[str] = Stage.SETUP
    session_id: str
    client_id: int
    params_digest: str
    round: int = 1

    def _body(self):
        return {"params_digest": self.params_digest}

    @classmethod
    def _parse(cls, d):
        return cls(_str(d, "session_id"), _int(d, "client_id"), _str(d, "params_digest"))


@dataclass(frozen=True)
class SetupAck(MessageBase):
    """Hospital -> server: parameters checked, ready."""

    TYPE: ClassVar[str] = "secagg.setup_ack"
    STAGE: ClassVar[str] = Stage.SETUP
    session_id: str
    client_id: int
    params_digest: str
    round: int = 1

    def _body(self):
        return {"params_digest": self.params_digest}

    @classmethod
    def _parse(cls, d):
        return cls(_str(d, "session_id"), _int(d, "client_id"), _str(d, "params_digest"))


@dataclass(frozen=True)
class AdvertiseKeysRequest(MessageBase):
    """Server -> hospital: send your two public keys."""

    TYPE: ClassVar[str] = "secagg.advertise_keys_request"
    STAGE: ClassVar[str] = Stage.ADVERTISE_KEYS
    session_id: str
    client_id: int
    round: int = 1

    def _body(self):
        return {}

    @classmethod
    def _parse(cls, d):
        return cls(_str(d, "session_id"), _int(d, "client_id"))


@dataclass(frozen=True)
class KeyAdvertisement(MessageBase):
    """Hospital -> server (relayed to everybody): ``c_u^PK`` (share encryption), ``s_u^PK`` (masks).

    Signed with the hospital's enrolled Ed25519 identity key over the session
    parameters' digest and both keys, so a relayed advertisement cannot be
    swapped and the list of them can seed the neighbour graph.
    """

    TYPE: ClassVar[str] = "secagg.key_advertisement"
    STAGE: ClassVar[str] = Stage.ADVERTISE_KEYS
    session_id: str
    client_id: int
    params_digest: str
    enc_public_key: bytes
    mask_public_key: bytes
    signature: bytes = b""
    round: int = 1

    def _unsigned(self) -> dict:
        return {"type": self.TYPE, "session_id": self.session_id, "client_id": self.client_id, "round": self.round,
                "params_digest": self.params_digest, "enc_public_key": _b64(self.enc_public_key),
                "mask_public_key": _b64(self.mask_public_key)}

    def signed(self, identity_key) -> "KeyAdvertisement":
        return replace(self, signature=identity_key.sign(_AD_PREFIX + _canonical(self._unsigned())))

    def verify(self, identity_public_key) -> bool:
        return _verify(identity_public_key, self.signature, _AD_PREFIX + _canonical(self._unsigned()))

    def _body(self):
        return {"params_digest": self.params_digest, "enc_public_key": _b64(self.enc_public_key),
                "mask_public_key": _b64(self.mask_public_key), "signature": _b64(self.signature)}

    @classmethod
    def _parse(cls, d):
        c, s, sig = _unb64(d["enc_public_key"]), _unb64(d["mask_public_key"]), _unb64(d["signature"])
        if len(c) != _KEY_BYTES or len(s) != _KEY_BYTES or len(sig) != _SIG_BYTES:
            raise ValueError("public keys are 32 bytes and the signature 64")
        return cls(_str(d, "session_id"), _int(d, "client_id"), _str(d, "params_digest"), c, s, sig)


@dataclass(frozen=True)
class ShareKeysRequest(MessageBase):
    """Server -> hospital: every signed advertisement it received (U1) and the graph seed it claims.

    The hospital recomputes the seed from the advertisements and refuses a
    different one (:func:`~secure_afl.secagg.settings.graph_seed`).
    """

    TYPE: ClassVar[str] = "secagg.share_keys_request"
    STAGE: ClassVar[str] = Stage.SHARE_KEYS
    session_id: str
    client_id: int
    advertisements: tuple[KeyAdvertisement, ...]
    graph_seed: bytes
    round: int = 1

    def _body(self):
        # Each advertisement travels as [client_id, c^PK, s^PK, signature]: its session, round and parameter
        # digest are the request's, stated once, which halves the O(K) part of the request.
        ads = self.advertisements
        digests = {a.params_digest for a in ads}
        if any((a.session_id, a.round) != (self.session_id, self.round) for a in ads) or len(digests) > 1:
            raise ValueError("relayed advertisements must belong to the request's session and round")
        return {"params_digest": digests.pop() if digests else "", "graph_seed": _b64(self.graph_seed),
                "advertisements": [[a.client_id, _b64(a.enc_public_key), _b64(a.mask_public_key), _b64(a.signature)]
                                   for a in ads]}

    @classmethod
    def _parse(cls, d):
        ads = d["advertisements"]
        if not isinstance(ads, list) or any(not isinstance(a, list) or len(a) != 4 for a in ads):
            raise ValueError("advertisements must be a list of [client_id, c_pk, s_pk, signature]")
        seed = _unb64(d["graph_seed"])
        if len(seed) != _DIGEST_BYTES:
            raise ValueError("graph seed is 32 bytes")
        sid, digest, r = _str(d, "session_id"), _str(d, "params_digest"), _round(d)
        parsed = tuple(KeyAdvertisement._parse({"session_id": sid, "client_id": a[0], "params_digest": digest,
                                                "enc_public_key": a[1], "mask_public_key": a[2],
                                                "signature": a[3]}) for a in ads)
        return cls(sid, _int(d, "client_id"), tuple(replace(a, round=r) for a in parsed), seed)


@dataclass(frozen=True)
class EncryptedShare:
    """``ChaCha20Poly1305(k_uv, nonce, share(b_u)_v || share(s_u^SK)_v, ad(session, u -> v))``.

    ``commit_b`` / ``commit_s`` are the dealer's SHA-256 commitments to the two
    shares (:func:`~secure_afl.secagg.masking.share_commitment`), sent in the
    clear: the holder checks them against what it decrypts, the server checks
    every share revealed at unmasking against them and discards a wrong one.
    """

    sender: int
    recipient: int
    nonce: bytes
    ciphertext: bytes
    commit_b: bytes
    commit_s: bytes

    def to_dict(self) -> dict:
        return {"sender": self.sender, "recipient": self.recipient, "nonce": _b64(self.nonce),
                "ciphertext": _b64(self.ciphertext), "commit_b": _b64(self.commit_b),
                "commit_s": _b64(self.commit_s)}

    @classmethod
    def from_dict(cls, d) -> "EncryptedShare":
        if not isinstance(d, Mapping):
            raise ValueError("share must be an object")
        nonce, cb, cs = _unb64(d["nonce"]), _unb64(d["commit_b"]), _unb64(d["commit_s"])
        if len(nonce) != _NONCE_BYTES or len(cb) != _DIGEST_BYTES or len(cs) != _DIGEST_BYTES:
            raise ValueError("nonce must be 12 bytes and commitments 32")
        return cls(_int(d, "sender"), _int(d, "recipient"), nonce, _unb64(d["ciphertext"]), cb, cs)


@dataclass(frozen=True)
class DealRecord:
    """A dealer's signed account of its dealing: every holder's commitments and the check polynomial ``z``.

    ``commitments`` holds ``(holder, commit_b, commit_s, commit_r)`` for each share holder (the dealer
    included), sorted by holder; ``check`` the t coefficients of ``z = r + c_1 f_b + c_2 f_s``
    (:func:`~secure_afl.secagg.masking.on_check_polynomial`). The dealer signs it with its identity key, so a
    holder whose shares match their commitments but miss ``z`` holds a proof against the dealer that anyone
    can check (:class:`DealerComplaint`), and a server cannot invent one.
    """

    session_id: str
    round: int
    params_digest: str
    dealer: int
    commitments: tuple[tuple[int, bytes, bytes, bytes], ...]
    check: tuple[int, ...]
    signature: bytes = b""

    def _signed_bytes(self) -> bytes:
        body = self._dict_unsigned()
        return _DEAL_PREFIX + _canonical(body)

    def _dict_unsigned(self) -> dict:
        return {"session_id": self.session_id, "round": self.round, "params_digest": self.params_digest,
                "dealer": self.dealer,
                "commitments": [[h, _b64(cb), _b64(cs), _b64(cr)] for h, cb, cs, cr in self.commitments],
                "check": [_b64(c.to_bytes(_VALUE_BYTES, "big")) for c in self.check]}

    def signed(self, identity_key) -> "DealRecord":
        return replace(self, signature=identity_key.sign(self._signed_bytes()))

    def verify(self, identity_public_key) -> bool:
        return _verify(identity_public_key, self.signature, self._signed_bytes())

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

    def to_dict(self) -> dict:
        return {**self._dict_unsigned(), "signature": _b64(self.signature)}

    @classmethod
    def from_dict(cls, d) -> "DealRecord":
        if not isinstance(d, Mapping):
            raise ValueError("a deal record is an object")
        rows = d["commitments"]
        if not isinstance(rows, list) or any(not isinstance(row, list) or len(row) != 4 for row in rows):
            raise ValueError("commitments are [holder, commit_b, commit_s, commit_r]")
        commitments = []
        for row in rows:
            h = row[0]
            if isinstance(h, bool) or not isinstance(h, int):
                raise ValueError("a holder id is an int")
            cb, cs, cr = (_unb64(x) for x in row[1:])
            if any(len(x) != _DIGEST_BYTES for x in (cb, cs, cr)):
                raise ValueError("commitments are 32 bytes")
            commitments.append((h, cb, cs, cr))
        holders = [h for h, *_ in commitments]
        if holders != sorted(set(holders)):
            raise ValueError("commitments are sorted by holder, one per holder")
        check = d["check"]
        if not isinstance(check, list):
            raise ValueError("check is a list of field elements")
        coeffs = []
        for c in check:
            raw = _unb64(c)
            if len(raw) != _VALUE_BYTES or int.from_bytes(raw, "big") >= PRIME:
                raise ValueError("a check coefficient is an element of GF(p)")
            coeffs.append(int.from_bytes(raw, "big"))
        return cls(_str(d, "session_id"), _round(d), _str(d, "params_digest"), _int(d, "dealer"),
                   tuple(commitments), tuple(coeffs), _signature(d["signature"]))


def _shares_list(v) -> tuple[EncryptedShare, ...]:
    if not isinstance(v, list):
        raise ValueError("shares must be a list")
    return tuple(EncryptedShare.from_dict(s) for s in v)


@dataclass(frozen=True)
class ShareKeysResponse(MessageBase):
    """Hospital -> server: one encrypted share pair per other share holder, for relaying.

    ``own_commit_b`` / ``own_commit_s`` commit to the shares the hospital keeps
    for itself (it reveals one of them at unmasking like any holder).
    """

    TYPE: ClassVar[str] = "secagg.share_keys_response"
    STAGE: ClassVar[str] = Stage.SHARE_KEYS
    session_id: str
    client_id: int
    shares: tuple[EncryptedShare, ...]
    own_commit_b: bytes
    own_commit_s: bytes
    deal: DealRecord | None = None
    round: int = 1

    def _body(self):
        return {"shares": [s.to_dict() for s in self.shares], "own_commit_b": _b64(self.own_commit_b),
                "own_commit_s": _b64(self.own_commit_s), "deal": None if self.deal is None else self.deal.to_dict()}

    @classmethod
    def _parse(cls, d):
        cb, cs = _unb64(d["own_commit_b"]), _unb64(d["own_commit_s"])
        if len(cb) != _DIGEST_BYTES or len(cs) != _DIGEST_BYTES:
            raise ValueError("commitments are 32 bytes")
        return cls(_str(d, "session_id"), _int(d, "client_id"), _shares_list(d["shares"]), cb, cs,
                   DealRecord.from_dict(d["deal"]))


@dataclass(frozen=True)
class MaskedInputRequest(MessageBase):
    """Server -> hospital: the encrypted shares addressed to it by holders that completed SHARE_KEYS (U2).

    ``deals`` are the signed deal records of their dealers, one per share.
    """

    TYPE: ClassVar[str] = "secagg.masked_input_request"
    STAGE: ClassVar[str] = Stage.MASKED_INPUT
    session_id: str
    client_id: int
    shares: tuple[EncryptedShare, ...]
    deals: tuple[DealRecord, ...] = ()
    round: int = 1

    def _body(self):
        return {"shares": [s.to_dict() for s in self.shares], "deals": [dl.to_dict() for dl in self.deals]}

    @classmethod
    def _parse(cls, d):
        deals = d["deals"]
        if not isinstance(deals, list):
            raise ValueError("deals must be a list")
        return cls(_str(d, "session_id"), _int(d, "client_id"), _shares_list(d["shares"]),
                   tuple(DealRecord.from_dict(x) for x in deals))


@dataclass(frozen=True)
class MaskedInput(MessageBase):
    """Hospital -> server: the sealed masked vector ``y_u``.

    ``to_bytes`` is the sealed envelope itself (binary, 8 L bytes of body);
    ``to_dict`` carries it base64-encoded.
    """

    TYPE: ClassVar[str] = "secagg.masked_input"
    STAGE: ClassVar[str] = Stage.MASKED_INPUT
    session_id: str
    client_id: int
    payload: bytes
    round: int = 1

    def _body(self):
        return {"payload": _b64(self.payload)}

    @classmethod
    def _parse(cls, d):
        return cls(_str(d, "session_id"), _int(d, "client_id"), _unb64(d["payload"]))

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
            r = _round(env.header)
        except (KeyError, ValueError):
            raise MalformedPayload("masked input header lacks its round") from None
        return cls(sid, cid, bytes(data), r)


@dataclass(frozen=True)
class DealerComplaint(MessageBase):
    """Holder -> server, instead of its masked input: "dealer ``deal.dealer`` dealt me shares that miss ``z``".

    Carries the dealer's signed :class:`DealRecord` and the holder's three shares of that dealing. It proves
    the dealer cheated when (:meth:`proves`) the record carries the dealer's signature, the three shares match
    the holder's commitments in it, and they miss the check polynomial. Revealing the shares costs nothing:
    they are shares of a cheater's secrets. Nothing in it needs the holder's or the server's word.
    """

    TYPE: ClassVar[str] = "secagg.dealer_complaint"
    STAGE: ClassVar[str] = Stage.MASKED_INPUT
    session_id: str
    client_id: int
    deal: DealRecord
    share_b: bytes
    share_s: bytes
    share_r: bytes
    round: int = 1

    def _body(self):
        return {"deal": self.deal.to_dict(), "share_b": _b64(self.share_b), "share_s": _b64(self.share_s),
                "share_r": _b64(self.share_r)}

    @classmethod
    def _parse(cls, d):
        return cls(_str(d, "session_id"), _int(d, "client_id"), DealRecord.from_dict(d["deal"]),
                   _unb64(d["share_b"]), _unb64(d["share_s"]), _unb64(d["share_r"]))

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


@dataclass(frozen=True)
class ConsistencyStatement(MessageBase):
    """Survivor -> server (relayed to every survivor): "I saw exactly this survivor set".

    Bonawitz et al.'s consistency check. Signed with the hospital's identity
    key over the session, round, parameters' digest, the graph seed (hence
    the advertised set U1), the number of survivors and the SHA-256 of the
    sorted survivor ids (:func:`survivors_digest`): by collision resistance a
    signature over the digest is a signature over the set, and checking q of
    them costs q short messages instead of q copies of the set.
    """

    TYPE: ClassVar[str] = "secagg.consistency"
    STAGE: ClassVar[str] = Stage.UNMASK
    session_id: str
    client_id: int
    params_digest: str
    graph_seed: bytes
    survivors: tuple[int, ...]
    signature: bytes = b""
    round: int = 1

    def _unsigned(self) -> dict:
        return {"type": self.TYPE, "session_id": self.session_id, "client_id": self.client_id, "round": self.round,
                "params_digest": self.params_digest, "graph_seed": _b64(self.graph_seed),
                "n_survivors": len(self.survivors), "survivors_sha256": survivors_digest(self.survivors).hex()}

    def signed(self, identity_key) -> "ConsistencyStatement":
        return replace(self, signature=identity_key.sign(_CONSISTENCY_PREFIX + _canonical(self._unsigned())))

    def verify(self, identity_public_key) -> bool:
        return _verify(identity_public_key, self.signature, _CONSISTENCY_PREFIX + _canonical(self._unsigned()))

    def _body(self):
        return {"params_digest": self.params_digest, "graph_seed": _b64(self.graph_seed),
                "survivors": list(self.survivors), "signature": _b64(self.signature)}

    @classmethod
    def _parse(cls, d):
        seed, surv = _survivor_set(d)
        return cls(_str(d, "session_id"), _int(d, "client_id"), _str(d, "params_digest"), seed, surv,
                   _signature(d["signature"]))


@functools.lru_cache(maxsize=8)
def survivors_digest(survivors: tuple[int, ...]) -> bytes:
    """SHA-256 of the canonical JSON of the sorted survivor ids: what a consistency statement signs.

    Cached because every statement of a round is over the same set: a hospital checking q of them, and the
    server receiving n, hash the list once.
    """
    return hashlib.sha256(_canonical(list(survivors))).digest()


def _survivor_set(d) -> tuple[bytes, tuple[int, ...]]:
    """The graph seed and the strictly increasing survivor ids of a statement (ValueError otherwise)."""
    seed, surv = _unb64(d["graph_seed"]), _ids(d["survivors"])
    if len(seed) != _DIGEST_BYTES or any(a >= b for a, b in zip(surv, surv[1:])):
        raise ValueError("bad graph seed or survivor list")
    return seed, surv


def _signature(v) -> bytes:
    sig = _unb64(v)
    if len(sig) != _SIG_BYTES:
        raise ValueError("bad signature")
    return sig


@dataclass(frozen=True)
class UnmaskRequest(MessageBase):
    """Server -> surviving hospital: reveal b-shares of ``survivors`` and key-shares of ``dropped``.

    ``statements`` are the survivors' signed consistency statements: the
    hospital answers only when a quorum of them signed the set it signed.
    """

    TYPE: ClassVar[str] = "secagg.unmask_request"
    STAGE: ClassVar[str] = Stage.UNMASK
    session_id: str
    client_id: int
    survivors: tuple[int, ...]
    dropped: tuple[int, ...]
    statements: tuple[ConsistencyStatement, ...] = ()
    round: int = 1

    def _body(self):
        # Every statement a hospital accepts is over the set it signed itself, so the set, digest, seed and
        # round travel once and each statement as [signer, signature]: O(K) bytes instead of O(K^2).
        st = self.statements
        common = {(s.session_id, s.params_digest, s.graph_seed, s.survivors, s.round) for s in st}
        if len(common) > 1:
            raise ValueError("an unmask request relays statements over one survivor set")
        signed = None
        if st:
            s0 = st[0]
            signed = {"session_id": s0.session_id, "params_digest": s0.params_digest,
                      "graph_seed": _b64(s0.graph_seed), "survivors": list(s0.survivors), "round": s0.round,
                      "signers": [[s.client_id, _b64(s.signature)] for s in st]}
        return {"survivors": list(self.survivors), "dropped": list(self.dropped), "statements": signed}

    @classmethod
    def _parse(cls, d):
        st = d["statements"]
        statements = ()
        if st is not None:
            if not isinstance(st, Mapping) or not isinstance(st["signers"], list):
                raise ValueError("statements must be an object with a signers list")
            # the shared part is parsed once: q statements over one set cost q signatures, not q survivor lists
            seed, surv = _survivor_set(st)
            sid, digest, r = _str(st, "session_id"), _str(st, "params_digest"), _round(st)
            statements = []
            for signer in st["signers"]:
                if not isinstance(signer, list) or len(signer) != 2:
                    raise ValueError("each signer is [client_id, signature]")
                cid = signer[0]
                if isinstance(cid, bool) or not isinstance(cid, int):
                    raise ValueError("a signer's client id is not an integer")
                statements.append(ConsistencyStatement(sid, cid, digest, seed, surv, _signature(signer[1]), r))
            statements = tuple(statements)
        return cls(_str(d, "session_id"), _int(d, "client_id"), _ids(d["survivors"]), _ids(d["dropped"]),
                   statements)


@dataclass(frozen=True)
class UnmaskResponse(MessageBase):
    """Hospital -> server: ``{owner: share bytes}`` for the self-mask seeds and the mask keys asked for."""

    TYPE: ClassVar[str] = "secagg.unmask_response"
    STAGE: ClassVar[str] = Stage.UNMASK
    session_id: str
    client_id: int
    self_mask_shares: Mapping[int, bytes]
    mask_key_shares: Mapping[int, bytes]
    round: int = 1

    def _body(self):
        return {
            "self_mask_shares": {str(k): _b64(v) for k, v in sorted(self.self_mask_shares.items())},
            "mask_key_shares": {str(k): _b64(v) for k, v in sorted(self.mask_key_shares.items())},
        }

    @classmethod
    def _parse(cls, d):
        def conv(m):
            if not isinstance(m, Mapping):
                raise ValueError("expected an object")
            return {int(k): _unb64(v) for k, v in m.items()}

        return cls(_str(d, "session_id"), _int(d, "client_id"), conv(d["self_mask_shares"]),
                   conv(d["mask_key_shares"]))



@dataclass
class UnmaskMaterial:
    """What the server reconstructed: enough to remove every mask from the survivors' sum, nothing more.

    ``self_mask_seeds[u]`` for u in survivors, ``dropped_mask_keys[v]`` (raw
    X25519 private key) for v in dropped, ``mask_public_keys`` of the
    survivors that masked with a dropped hospital, and the ``graph_seed`` that
    says who masked with whom.
    """

    survivors: tuple[int, ...]
    dropped: tuple[int, ...]
    self_mask_seeds: dict[int, bytes]
    dropped_mask_keys: dict[int, bytes]
    mask_public_keys: dict[int, bytes] = field(default_factory=dict)
    graph_seed: bytes = b""
    round: int = 1

    def to_dict(self) -> dict:
        enc = lambda m: {str(k): _b64(v) for k, v in sorted(m.items())}  # noqa: E731
        return {"survivors": list(self.survivors), "dropped": list(self.dropped),
                "self_mask_seeds": enc(self.self_mask_seeds), "dropped_mask_keys": enc(self.dropped_mask_keys),
                "mask_public_keys": enc(self.mask_public_keys), "graph_seed": _b64(self.graph_seed),
                "round": self.round}

    @classmethod
    def from_dict(cls, d) -> "UnmaskMaterial":
        try:
            dec = lambda m: {int(k): _unb64(v) for k, v in m.items()}  # noqa: E731
            return cls(_ids(d["survivors"]), _ids(d["dropped"]), dec(d["self_mask_seeds"]),
                       dec(d["dropped_mask_keys"]), dec(d.get("mask_public_keys", {})), _unb64(d["graph_seed"]),
                       _round(d))
        except (KeyError, TypeError, ValueError, AttributeError, binascii.Error):
            raise MalformedPayload("malformed unmask material") from None
