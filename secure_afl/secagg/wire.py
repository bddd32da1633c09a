"""secagg's wire machinery: the codecs, the field table and the record every message is declared from.

A message (or a record carried inside one) names its fields once, in a table of :class:`Field` rows: the
field's name, its codec (type and bounds), whether its signature covers it, and its default.
:func:`declare` turns the table into the frozen dataclass; encoding, decoding, validation and the bytes a
signature covers are written once, in :class:`Record`, from the table. Every message also carries
``type``, ``stage``, ``session_id``, ``client_id`` and ``round`` (1 to 65535). A field that fails its codec
raises :class:`~secure_afl.exceptions.MalformedPayload` naming the message, the field and why. The messages
themselves are in :mod:`secure_afl.secagg.messages`.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
from dataclasses import dataclass, replace
from typing import Any, Callable, ClassVar, Mapping

from cryptography.exceptions import InvalidSignature

from ..exceptions import MalformedPayload
from ..hazmat.shamir import PRIME
from ..encoding import canonical_json, parse_json

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
class Codec:
    annotation = "Any"

    def enc(self, v):
        return v

    def dec(self, raw):
        raise NotImplementedError


class _Str(Codec):
    annotation = "str"

    def dec(self, raw):
        if not isinstance(raw, str):
            raise ValueError("must be a string")
        return raw


class _Int(Codec):
    annotation = "int"

    def __init__(self, lo: int | None = None, hi: int | None = None):
        self.lo, self.hi = lo, hi

    def dec(self, raw):
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise ValueError("must be an int")
        if (self.lo is not None and raw < self.lo) or (self.hi is not None and raw > self.hi):
            raise ValueError(f"out of range [{self.lo}, {self.hi}]")
        return raw


class _B64(Codec):
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


class FieldElementCodec(Codec):
    """An element of GF(2^521 - 1): 66 bytes big-endian, below the prime."""

    annotation = "int"

    def enc(self, v):
        return _B64().enc(v.to_bytes(_VALUE_BYTES, "big"))

    def dec(self, raw):
        value = int.from_bytes(_B64(_VALUE_BYTES).dec(raw), "big")
        if value >= PRIME:
            raise ValueError("not an element of GF(p)")
        return value


class IdsCodec(Codec):
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


class ListCodec(Codec):
    annotation = "tuple"

    def __init__(self, item: Codec, rule: Callable[[tuple], bool] | None = None, rule_says: str = ""):
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


class RowCodec(Codec):
    """A fixed-length JSON list of differently typed items, as a tuple."""

    annotation = "tuple"

    def __init__(self, *items: Codec):
        self.items = items

    def enc(self, v):
        return [c.enc(x) for c, x in zip(self.items, v)]

    def dec(self, raw):
        if not isinstance(raw, list) or len(raw) != len(self.items):
            raise ValueError(f"must be a list of {len(self.items)}")
        return tuple(c.dec(x) for c, x in zip(self.items, raw))


class IntMapCodec(Codec):
    """``{owner id: value}`` as a JSON object keyed by the decimal id, sorted."""

    annotation = "Mapping[int, bytes]"

    def __init__(self, value: Codec):
        self.value = value

    def enc(self, v):
        return {str(k): self.value.enc(x) for k, x in sorted(v.items())}

    def dec(self, raw):
        if not isinstance(raw, Mapping):
            raise ValueError("expected an object")
        return {int(k): self.value.dec(x) for k, x in raw.items()}


class NestedCodec(Codec):
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
    codec: Codec
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


def declare(*fields: Field, frozen: bool = True):
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
REGISTRY: dict[str, type] = {}


class Record:
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
    def from_dict(cls, d) -> "Record":
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


def message_fields(*body: Field):
    """A message's table: the header (session, client), its own fields, then the round (default 1)."""
    return declare(Field("session_id", STR), Field("client_id", INT), *body, Field("round", ROUND, default=1))


class MessageBase(Record):
    """Base: JSON-safe ``to_dict``/``from_dict`` and canonical-JSON ``to_bytes``/``from_bytes``."""

    TYPE: ClassVar[str]
    STAGE: ClassVar[str]

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        REGISTRY[cls.TYPE] = cls

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
        return cls.from_dict(parse_message_json(data))


def parse_message_json(data) -> Any:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError("message must be bytes")
    return parse_json(data, "secagg message")
