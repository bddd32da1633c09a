"""secagg messages: canonical JSON on the wire, parsed strictly, each declared by one field table.

A message (or a record carried inside one) names its fields once, in a table of :class:`Field` rows: the
field's name, its codec (type and bounds), whether its signature covers it, and its default.
:func:`_declare` turns the table into the frozen dataclass; encoding, decoding, validation and the bytes a
signature covers are written once, in :class:`_Record`, from the table. Every message also carries
``type``, ``stage``, ``session_id``, ``client_id`` and ``round`` (1 to 65535). A field that fails its codec
raises :class:`~secure_afl.exceptions.MalformedPayload` naming the message, the field and why.

The wire bytes are pinned by vectors/secagg_messages.json (tests/test_secagg_vectors.py).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import functools
import hashlib
from dataclasses import dataclass, replace
from typing import Any, Callable, ClassVar, Mapping

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
    "UnmaskResponse", "UnmaskMaterial", "DealRecord", "DealerComplaint", "decode_message", "survivors_digest",
]

_KEY_BYTES = 32
_NONCE_BYTES = 12
_DIGEST_BYTES = 32
_SIG_BYTES = 64
_VALUE_BYTES = 66  # one element of GF(2^521 - 1)
_MAX_ROUND = 0xFFFF


class _Bad(ValueError):
    """A field failed its codec; ``str`` is ``path: reason``."""


def _verify(public_key, signature: bytes, data: bytes) -> bool:
    try:
        public_key.verify(signature, data)
    except (InvalidSignature, TypeError, ValueError):
        return False
    return True


# -- codecs: one per wire type; ``dec`` raises ValueError (or _Bad from a nested record) with the reason ----------
class _Codec:
    annotation = "Any"

    def enc(self, v):
        return v

    def dec(self, raw):
        raise NotImplementedError


class _Str(_Codec):
    annotation = "str"

    def dec(self, raw):
        if not isinstance(raw, str):
            raise ValueError("must be a string")
        return raw


class _Int(_Codec):
    annotation = "int"

    def __init__(self, lo: int | None = None, hi: int | None = None):
        self.lo, self.hi = lo, hi

    def dec(self, raw):
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise ValueError("must be an int")
        if (self.lo is not None and raw < self.lo) or (self.hi is not None and raw > self.hi):
            raise ValueError(f"out of range [{self.lo}, {self.hi}]")
        return raw


class _B64(_Codec):
    """Bytes as base64 text; ``size`` is enforced on decoding only (an unsigned message encodes ``b""``)."""

    annotation = "bytes"

    def __init__(self, size: int | None = None):
        self.size = size

    def enc(self, v):
        return base64.b64encode(v).decode("ascii")

    def dec(self, raw):
        if not isinstance(raw, str):
            raise ValueError("expected base64 text")
        try:
            out = base64.b64decode(raw.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError):
            raise ValueError("not base64") from None
        if self.size is not None and len(out) != self.size:
            raise ValueError(f"must be {self.size} bytes, got {len(out)}")
        return out


class _FieldElement(_Codec):
    """An element of GF(2^521 - 1): 66 bytes big-endian, below the prime."""

    annotation = "int"

    def enc(self, v):
        return _B64().enc(v.to_bytes(_VALUE_BYTES, "big"))

    def dec(self, raw):
        value = int.from_bytes(_B64(_VALUE_BYTES).dec(raw), "big")
        if value >= PRIME:
            raise ValueError("not an element of GF(p)")
        return value


class _Ids(_Codec):
    """Client ids as a JSON list; ``increasing`` also requires them strictly increasing (a set)."""

    annotation = "tuple[int, ...]"

    def __init__(self, increasing: bool = False):
        self.increasing = increasing

    def enc(self, v):
        return list(v)

    def dec(self, raw):
        if not isinstance(raw, list) or any(isinstance(x, bool) or not isinstance(x, int) for x in raw):
            raise ValueError("expected a list of ints")
        if self.increasing and any(a >= b for a, b in zip(raw, raw[1:])):
            raise ValueError("must be strictly increasing")
        return tuple(raw)


class _List(_Codec):
    annotation = "tuple"

    def __init__(self, item: _Codec, rule: Callable[[tuple], bool] | None = None, rule_says: str = ""):
        self.item, self.rule, self.rule_says = item, rule, rule_says

    def enc(self, v):
        return [self.item.enc(x) for x in v]

    def dec(self, raw):
        if not isinstance(raw, list):
            raise ValueError("must be a list")
        out = []
        for i, x in enumerate(raw):
            try:
                out.append(self.item.dec(x))
            except _Bad as e:
                raise _Bad(f"[{i}].{e}") from None
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise _Bad(f"[{i}]: {_reason(e)}") from None
        out = tuple(out)
        if self.rule is not None and not self.rule(out):
            raise ValueError(self.rule_says)
        return out


class _Row(_Codec):
    """A fixed-length JSON list of differently typed items, as a tuple."""

    annotation = "tuple"

    def __init__(self, *items: _Codec):
        self.items = items

    def enc(self, v):
        return [c.enc(x) for c, x in zip(self.items, v)]

    def dec(self, raw):
        if not isinstance(raw, list) or len(raw) != len(self.items):
            raise ValueError(f"must be a list of {len(self.items)}")
        return tuple(c.dec(x) for c, x in zip(self.items, raw))


class _IntMap(_Codec):
    """``{owner id: value}`` as a JSON object keyed by the decimal id, sorted."""

    annotation = "Mapping[int, bytes]"

    def __init__(self, value: _Codec):
        self.value = value

    def enc(self, v):
        return {str(k): self.value.enc(x) for k, x in sorted(v.items())}

    def dec(self, raw):
        if not isinstance(raw, Mapping):
            raise ValueError("expected an object")
        return {int(k): self.value.dec(x) for k, x in raw.items()}


class _Nested(_Codec):
    """A record inside a message (its own table); ``None`` encodes as null and never decodes."""

    def __init__(self, cls_name: str):
        self.cls_name = cls_name
        self.annotation = cls_name

    def enc(self, v):
        return None if v is None else v.to_dict()

    def dec(self, raw):
        return _RECORDS[self.cls_name]._decode(raw)


STR, INT, ROUND = _Str(), _Int(), _Int(1, _MAX_ROUND)
KEY, NONCE, DIGEST, SIGNATURE, BLOB = _B64(_KEY_BYTES), _B64(_NONCE_BYTES), _B64(_DIGEST_BYTES), _B64(_SIG_BYTES), _B64()


def _reason(e: BaseException) -> str:
    if isinstance(e, KeyError):
        return f"missing {e.args[0]!r}" if e.args else "missing"
    return str(e) or type(e).__name__


# -- fields and the table -> class step ----------------------------------------------------------------------------
class _Missing:
    def __repr__(self):
        return "MISSING"


_MISSING = _Missing()  # Field is itself a dataclass: a default of dataclasses.MISSING would read as "no default"


@dataclass(frozen=True)
class Field:
    """One row of a message's table.

    ``signed``: the message's signature covers it (only for a class with ``SIGNING_PREFIX``). ``optional``: a
    decoder takes the default when the key is absent. ``put``/``take`` write and read the wire keys; a
    compact field (relayed advertisements, statements) overrides them.
    """

    name: str
    codec: _Codec
    signed: bool = True
    default: Any = _MISSING
    default_factory: Any = _MISSING
    optional: bool = False

    def put(self, obj, out: dict) -> None:
        out[self.name] = self.codec.enc(getattr(obj, self.name))

    def take(self, d: Mapping):
        if self.optional and self.name not in d:
            return self.default_factory() if self.default_factory is not _MISSING else self.default
        return self.codec.dec(d[self.name])


def _declare(*fields: Field, frozen: bool = True):
    """The dataclass of a field table: fields in table order, defaults from the table."""

    def wrap(cls):
        cls.FIELDS = fields
        cls.__annotations__ = {f.name: f.codec.annotation for f in fields}
        for f in fields:
            if f.default_factory is not _MISSING:
                setattr(cls, f.name, dataclasses.field(default_factory=f.default_factory))
            elif f.default is not _MISSING:
                setattr(cls, f.name, f.default)
        cls = dataclass(frozen=frozen)(cls)
        _RECORDS[cls.__name__] = cls
        return cls

    return wrap


_RECORDS: dict[str, type] = {}
_REGISTRY: dict[str, type] = {}


class _Record:
    """Encoding, decoding and signing of a field table (a record: no type, stage or header of its own)."""

    FIELDS: ClassVar[tuple[Field, ...]] = ()
    SIGNING_PREFIX: ClassVar[bytes | None] = None
    WHAT: ClassVar[str] = "record"

    def to_dict(self) -> dict:
        out = self._head()
        for f in self.FIELDS:
            f.put(self, out)
        return out

    def _head(self) -> dict:
        return {}

    @classmethod
    def _decode(cls, d):
        """The record from a JSON value; ``_Bad`` (a ValueError) naming the field that failed."""
        if not isinstance(d, Mapping):
            raise ValueError(f"a {cls.WHAT} is an object")
        values = {}
        for f in cls.FIELDS:
            try:
                values[f.name] = f.take(d)
            except _Bad as e:
                raise _Bad(f"{f.name}{'' if str(e).startswith('[') else '.'}{e}") from None
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise _Bad(f"{f.name}: {_reason(e)}") from None
        return cls(**values)

    @classmethod
    def from_dict(cls, d) -> "_Record":
        try:
            return cls._decode(d)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise MalformedPayload(f"malformed {cls.WHAT}: {_reason(e)}") from None

    # -- signatures: PREFIX || canonical JSON of the signed fields (and a message's type) ---------------------------
    def _signed_dict(self) -> dict:
        out = {"type": self.TYPE} if isinstance(self, MessageBase) else {}
        for f in self.FIELDS:
            if f.signed:
                f.put(self, out)
        out.update(self._derived())
        return out

    def _derived(self) -> dict:
        """Signed values computed from the fields rather than carried (a consistency statement's digest)."""
        return {}

    def signing_bytes(self) -> bytes:
        return self.SIGNING_PREFIX + canonical_json(self._signed_dict())

    def signed(self, identity_key):
        return replace(self, signature=identity_key.sign(self.signing_bytes()))

    def verify(self, identity_public_key) -> bool:
        return _verify(identity_public_key, self.signature, self.signing_bytes())


def _message(*body: Field):
    """A message's table: the header (session, client), its own fields, then the round (default 1)."""
    return _declare(Field("session_id", STR), Field("client_id", INT), *body, Field("round", ROUND, default=1))


class MessageBase(_Record):
    """Base: JSON-safe ``to_dict``/``from_dict`` and canonical-JSON ``to_bytes``/``from_bytes``."""

    TYPE: ClassVar[str]
    STAGE: ClassVar[str]

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        _REGISTRY[cls.TYPE] = cls

    def _head(self) -> dict:
        return {"type": self.TYPE, "stage": self.STAGE}

    @classmethod
    def from_dict(cls, d: Mapping) -> "MessageBase":
        if not isinstance(d, Mapping) or d.get("type") != cls.TYPE or d.get("stage") != cls.STAGE:
            raise MalformedPayload(f"not a {cls.TYPE} message")
        try:
            return cls._decode(d)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise MalformedPayload(f"malformed {cls.TYPE} message: {_reason(e)}") from None

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


# -- the messages, stage by stage --------------------------------------------------------------------------------
@_message(Field("params_digest", STR))
class SetupRequest(MessageBase):
    """Server -> hospital: join ``session_id`` as ``client_id`` under parameters ``params_digest``."""

    TYPE = "secagg.setup_request"
    STAGE = Stage.SETUP


@_message(Field("params_digest", STR))
class SetupAck(MessageBase):
    """Hospital -> server: parameters checked, ready."""

    TYPE = "secagg.setup_ack"
    STAGE = Stage.SETUP


@_message()
class AdvertiseKeysRequest(MessageBase):
    """Server -> hospital: send your two public keys."""

    TYPE = "secagg.advertise_keys_request"
    STAGE = Stage.ADVERTISE_KEYS


@_message(Field("params_digest", STR), Field("enc_public_key", KEY), Field("mask_public_key", KEY),
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

    _ROW = _Row(INT, KEY, KEY, SIGNATURE)

    def put(self, obj, out):
        ads = obj.advertisements
        digests = {a.params_digest for a in ads}
        if any((a.session_id, a.round) != (obj.session_id, obj.round) for a in ads) or len(digests) > 1:
            raise ValueError("relayed advertisements must belong to the request's session and round")
        out["params_digest"] = digests.pop() if digests else ""
        out["advertisements"] = [self._ROW.enc((a.client_id, a.enc_public_key, a.mask_public_key, a.signature))
                                 for a in ads]

    def take(self, d):
        rows = _List(self._ROW).dec(d["advertisements"])
        sid, digest, r = STR.dec(d["session_id"]), STR.dec(d["params_digest"]), ROUND.dec(d["round"])
        return tuple(KeyAdvertisement(sid, cid, digest, c, s, sig, round=r) for cid, c, s, sig in rows)


@_message(_RelayedAdvertisements("advertisements", _Codec()), Field("graph_seed", DIGEST))
class ShareKeysRequest(MessageBase):
    """Server -> hospital: every signed advertisement it received (U1) and the graph seed it claims.

    The hospital recomputes the seed from the advertisements and refuses a
    different one (:func:`~secure_afl.secagg.settings.graph_seed`).
    """

    TYPE = "secagg.share_keys_request"
    STAGE = Stage.SHARE_KEYS


@_declare(Field("sender", INT), Field("recipient", INT), Field("nonce", NONCE), Field("ciphertext", BLOB),
          Field("commit_b", DIGEST), Field("commit_s", DIGEST))
class EncryptedShare(_Record):
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


@_declare(Field("session_id", STR), Field("round", ROUND), Field("params_digest", STR), Field("dealer", INT),
          Field("commitments", _List(_Row(INT, DIGEST, DIGEST, DIGEST), _sorted_holders,
                                     "commitments are sorted by holder, one per holder")),
          Field("check", _List(_FieldElement())), Field("signature", SIGNATURE, signed=False, default=b""))
class DealRecord(_Record):
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


@_message(Field("shares", _List(_Nested("EncryptedShare"))), Field("own_commit_b", DIGEST),
          Field("own_commit_s", DIGEST), Field("deal", _Nested("DealRecord"), default=None))
class ShareKeysResponse(MessageBase):
    """Hospital -> server: one encrypted share pair per other share holder, for relaying.

    ``own_commit_b`` / ``own_commit_s`` commit to the shares the hospital keeps
    for itself (it reveals one of them at unmasking like any holder). ``deal``
    is required on the wire: ``None`` only stands for "not dealt yet" in memory.
    """

    TYPE = "secagg.share_keys_response"
    STAGE = Stage.SHARE_KEYS


@_message(Field("shares", _List(_Nested("EncryptedShare"))),
          Field("deals", _List(_Nested("DealRecord")), default=()))
class MaskedInputRequest(MessageBase):
    """Server -> hospital: the encrypted shares addressed to it by holders that completed SHARE_KEYS (U2).

    ``deals`` are the signed deal records of their dealers, one per share.
    """

    TYPE = "secagg.masked_input_request"
    STAGE = Stage.MASKED_INPUT


@_message(Field("payload", BLOB))
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


@_message(Field("deal", _Nested("DealRecord")), Field("share_b", BLOB), Field("share_s", BLOB),
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


@_message(Field("params_digest", STR), Field("graph_seed", DIGEST),
          Field("survivors", _Ids(increasing=True), signed=False),
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

    _SIGNER = _Row(INT, SIGNATURE)

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
        seed, surv = DIGEST.dec(st["graph_seed"]), _Ids(increasing=True).dec(st["survivors"])
        sid, digest, r = STR.dec(st["session_id"]), STR.dec(st["params_digest"]), ROUND.dec(st["round"])
        signers = _List(self._SIGNER).dec(st["signers"])
        return tuple(ConsistencyStatement(sid, cid, digest, seed, surv, sig, r) for cid, sig in signers)


@_message(Field("survivors", _Ids()), Field("dropped", _Ids()),
          _RelayedStatements("statements", _Codec(), default=()))
class UnmaskRequest(MessageBase):
    """Server -> surviving hospital: reveal b-shares of ``survivors`` and key-shares of ``dropped``.

    ``statements`` are the survivors' signed consistency statements: the
    hospital answers only when a quorum of them signed the set it signed.
    """

    TYPE = "secagg.unmask_request"
    STAGE = Stage.UNMASK


@_message(Field("self_mask_shares", _IntMap(BLOB)), Field("mask_key_shares", _IntMap(BLOB)))
class UnmaskResponse(MessageBase):
    """Hospital -> server: ``{owner: share bytes}`` for the self-mask seeds and the mask keys asked for."""

    TYPE = "secagg.unmask_response"
    STAGE = Stage.UNMASK


@_declare(Field("survivors", _Ids()), Field("dropped", _Ids()), Field("self_mask_seeds", _IntMap(BLOB)),
          Field("dropped_mask_keys", _IntMap(BLOB)),
          Field("mask_public_keys", _IntMap(BLOB), default_factory=dict, optional=True),
          Field("graph_seed", BLOB, default=b""), Field("round", ROUND, default=1), frozen=False)
class UnmaskMaterial(_Record):
    """What the server reconstructed: enough to remove every mask from the survivors' sum, nothing more.

    ``self_mask_seeds[u]`` for u in survivors, ``dropped_mask_keys[v]`` (raw
    X25519 private key) for v in dropped, ``mask_public_keys`` of the
    survivors that masked with a dropped hospital, and the ``graph_seed`` that
    says who masked with whom.
    """

    WHAT = "unmask material"
