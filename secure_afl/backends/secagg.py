"""``secagg``: additive masking in Z_(2^64) with dropout recovery.

After Bonawitz et al. 2017 ("Practical Secure Aggregation for
Privacy-Preserving Machine Learning", semi-honest variant) with the SecAgg+
neighbour graph of Bell et al. 2020 ("Secure Single-Server Aggregation with
(Poly)Logarithmic Overhead") as an option for many hospitals.

Roles and what they see (threat model: honest-but-curious server, at most
``threshold - 1`` colluding hospitals, no network code here):

* hospital (:class:`SecAggClient`): its own vector, its own secrets, the
  public keys of its neighbours and the shares its neighbours sent it;
* server (:class:`SecAggServerRound`): public keys, AEAD ciphertexts it
  relays, masked inputs, their mod-2^64 sum, and -- after unmasking -- the
  self-mask seeds of survivors and the mask keys of dropped hospitals, which
  together reveal only the sum of the survivors' vectors.

Protocol stages (each is one request from the server and one response from
each hospital; the hospital enforces the order, :class:`Stage`)::

    [Stage 0] SETUP           SetupRequest         -> SetupAck
    [Stage 1] ADVERTISE_KEYS  AdvertiseKeysRequest -> KeyAdvertisement (c_u^PK, s_u^PK)
    [Stage 2] SHARE_KEYS      ShareKeysRequest     -> ShareKeysResponse (AEAD(shares of b_u, s_u^SK))
    [Stage 3] MASKED_INPUT    MaskedInputRequest   -> MaskedInput (sealed y_u)
    [Stage 4] UNMASK          UnmaskRequest        -> UnmaskResponse (b-shares of survivors,
                                                                      s-shares of dropped)

Masking. Hospital u with fixed-point vector ``x_u = enc(v_u)`` (see
:mod:`secure_afl.hazmat.fixedpoint`) uploads::

    y_u = x_u + PRG(b_u) + sum_{v in N(u) cap U2, v > u} PRG(s_uv)
                         - sum_{v in N(u) cap U2, v < u} PRG(s_uv)      (mod 2^64)

with ``s_uv = HKDF(X25519(s_u^SK, s_v^PK), session, {u, v})``. The server sums
``S = sum_{u in U3} y_u mod 2^64``; pairwise masks between survivors cancel.
It then reconstructs ``b_u`` for every survivor and ``s_v^SK`` for every
dropped ``v in D = U2 \\ U3`` from at least ``threshold`` Shamir shares and
computes::

    sum_{u in U3} x_u = S - sum_{u in U3} PRG(b_u)
                          - sum_{v in D} sum_{u in N(v) cap U3} sign(u, v) PRG(s_uv)

where ``sign(u, v) = +1 if v > u else -1``. Because the declared bounds keep
the integer sum inside (-2^63, 2^63) (:func:`~secure_afl.hazmat.fixedpoint.choose_frac_bits`),
the result is bit-for-bit the plaintext fixed-point sum.

Notes
-----
``threshold`` t trades privacy against dropout tolerance. Each hospital's
secrets are shared among its ``m = degree + 1`` share holders (its
neighbours and itself). A coalition needs t holders to learn a secret, so a
higher t tolerates more colluders (better privacy) but the round aborts as
soon as fewer than t holders of some hospital survive (less dropout
tolerance: at most ``m - t`` holders may drop). We require ``t > m / 2``: any
t holders asked for b-shares and any t holders asked for key-shares then
share one honest holder, who refuses to answer both (the hospital checks
that the two lists of an unmask request are disjoint). The default is the
smallest such t, ``floor(m / 2) + 1``: maximum dropout tolerance at the
honest-majority floor.

With ``neighbours=k`` each hospital only masks with and shares to ``k``
neighbours of a random Harary graph (a ring after a public pseudo-random
permutation derived from ``graph_seed``), so the cost per hospital is
O(k L + k^2) instead of O(K L + K^2); Bell et al. show ``k = O(log K)``
suffices against a constant fraction of corrupted and dropped hospitals.
:func:`recommended_neighbours` gives ``2 ceil(1.5 log2 K)`` (K = 1000 -> 30).
Unmask requests are not signed here: the honest-but-curious server is
trusted to send consistent lists (the hospital checks each list it receives).
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import logging
import math
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterable, Mapping, Sequence

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from .._validation import check_int, check_real, param_error
from ..envelope import open_envelope, peek_header, seal
from ..exceptions import (
    DuplicateContribution,
    InsufficientShares,
    InvalidContribution,
    InvalidInputError,
    InvalidParameterError,
    MalformedPayload,
    OverlappingUnmaskRequest,
    ParameterMismatch,
    RoundAlreadyClosed,
    SecureAFLError,
    StageError,
    WrongSession,
)
from ..hazmat import fixedpoint
from ..hazmat.prg import DOMAIN_GRAPH, DOMAIN_PAIR_MASK, DOMAIN_SELF_MASK, agree, expand
from ..hazmat.shamir import Share, combine_shares, create_shares
from ..packing import Layout
from ..params import Bounds, SessionParams
from ..signing import parse_json
from .base import Combiner, ProtectionBackend, check_vector

__all__ = [
    "PROTOCOL",
    "Stage",
    "SecAggBackend",
    "SecAggClient",
    "SecAggServerRound",
    "UnmaskMaterial",
    "SetupRequest",
    "SetupAck",
    "AdvertiseKeysRequest",
    "KeyAdvertisement",
    "ShareKeysRequest",
    "EncryptedShare",
    "ShareKeysResponse",
    "MaskedInputRequest",
    "MaskedInput",
    "UnmaskRequest",
    "UnmaskResponse",
    "decode_message",
    "secagg_session_params",
    "recommended_neighbours",
    "neighbour_graph",
    "simulate_round",
]

logger = logging.getLogger(__name__)

PROTOCOL = "secagg/v1"
_KEY_BYTES = 32
_NONCE_BYTES = 12


# ---------------------------------------------------------------------------
# Shared vocabulary
# ---------------------------------------------------------------------------
class Stage:
    """Protocol stages, in order (Flower's ``secaggplus_constants.Stage`` style)."""

    SETUP = "setup"
    ADVERTISE_KEYS = "advertise_keys"
    SHARE_KEYS = "share_keys"
    MASKED_INPUT = "masked_input"
    UNMASK = "unmask"
    _order = (SETUP, ADVERTISE_KEYS, SHARE_KEYS, MASKED_INPUT, UNMASK)

    def __new__(cls):  # pragma: no cover - namespace only
        raise TypeError(f"{cls.__name__} cannot be instantiated.")

    @classmethod
    def all(cls) -> tuple[str, ...]:
        return cls._order

    @classmethod
    def index(cls, stage: str) -> int:
        return cls._order.index(stage)


_DONE = "done"
_ABORTED = "aborted"


# ---------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------
def recommended_neighbours(n_parties: int) -> int | None:
    """Even degree ``2 ceil(1.5 log2 n)`` for the SecAgg+ graph, or None (complete graph) if that is not smaller."""
    n = check_int("n_parties", n_parties, "recommended_neighbours", low=2)
    k = 2 * math.ceil(1.5 * math.log2(n))
    return None if k >= n - 1 else k


def _degree(n_parties: int, neighbours: int | None) -> int:
    return n_parties - 1 if neighbours is None else neighbours


def secagg_session_params(
    session_id: str,
    layout: Layout,
    gamma: float,
    bounds: Bounds,
    *,
    threshold: int | None = None,
    neighbours: int | None = None,
    n_parties: int | None = None,
    frac_bits: int | None = None,
    graph_seed: bytes | None = None,
) -> SessionParams:
    """Build and validate :class:`SessionParams` for the ``secagg`` backend.

    Parameters
    ----------
    session_id, layout, gamma, bounds
        As in :class:`~secure_afl.params.SessionParams`.
    threshold : int, optional
        Shamir threshold t; default ``floor(m / 2) + 1`` with ``m = degree + 1``
        share holders per hospital. Must satisfy ``m / 2 < t <= m``.
    neighbours : int, optional
        Even degree k of the SecAgg+ neighbour graph; None (default) is the
        complete graph of Bonawitz et al. A k >= n_parties - 1 is the complete
        graph and is stored as None.
    n_parties : int, optional
        Number of enrolled hospitals (client ids ``1..n_parties``); default and
        maximum ``bounds.k_max`` (the no-wrap proof is for k_max summands).
    frac_bits : int, optional
        Fixed-point fractional bits; default :func:`~secure_afl.hazmat.fixedpoint.choose_frac_bits`.
        An explicit value is checked against the no-wrap condition.
    graph_seed : bytes, optional
        32 public bytes that fix the neighbour graph; default fresh random.

    Notes
    -----
    See the module docstring for the privacy/dropout trade-off of ``threshold``.
    """
    caller = "secagg_session_params"
    if not isinstance(bounds, Bounds):
        raise param_error("bounds", caller, "a Bounds", bounds)
    gamma = check_real("gamma", gamma, caller, low=0.0)
    n = bounds.k_max if n_parties is None else check_int("n_parties", n_parties, caller, low=2)
    if n < 2:
        raise InvalidParameterError(
            f"secagg needs at least 2 parties; bounds.k_max={bounds.k_max}; raise `k_max` or pass `n_parties`"
        )
    if n > bounds.k_max:
        raise InvalidParameterError(
            f"n_parties={n} exceeds bounds.k_max={bounds.k_max}; the no-wrap bound covers k_max summands: "
            "raise `k_max` in the declared bounds or enrol fewer hospitals"
        )
    if n > 0xFFFF:
        raise InvalidParameterError(f"n_parties={n} exceeds 65535; split the consortium into several sessions")
    if neighbours is not None:
        k = check_int("neighbours", neighbours, caller, low=2)
        if k >= n - 1:
            neighbours = None
        elif k % 2:
            raise InvalidParameterError(
                f"neighbours={k} must be even (random Harary graph); use neighbours={k - 1} or {k + 1}"
            )
        else:
            neighbours = k
    m = _degree(n, neighbours) + 1
    floor_t = m // 2 + 1
    if threshold is None:
        threshold = max(2, floor_t)
    else:
        threshold = check_int("threshold", threshold, caller, low=2)
        if threshold > m:
            if neighbours is None:
                raise InvalidParameterError(
                    f"threshold={threshold} exceeds n_parties={n}; lower `threshold` or enrol more hospitals"
                )
            raise InvalidParameterError(
                f"threshold={threshold} exceeds the {m} share holders per hospital (neighbours={neighbours} + 1); "
                "lower `threshold` or raise `neighbours`"
            )
        if threshold < floor_t:
            raise InvalidParameterError(
                f"threshold={threshold} is not a majority of the {m} share holders per hospital; "
                f"raise `threshold` to at least {floor_t} (a smaller one would let the server collect both "
                "kinds of shares of one hospital from two disjoint groups)"
            )
    if frac_bits is None:
        frac_bits = fixedpoint.choose_frac_bits(bounds, gamma)
    else:
        frac_bits = fixedpoint.check_frac_bits(frac_bits, bounds, gamma)
    if graph_seed is None:
        graph_seed = secrets.token_bytes(32)
    if not isinstance(graph_seed, (bytes, bytearray)) or len(graph_seed) != 32:
        raise param_error("graph_seed", caller, "32 bytes", graph_seed)
    return SessionParams(
        session_id=session_id,
        backend="secagg",
        layout=layout,
        gamma=gamma,
        bounds=bounds,
        backend_params={
            "protocol": PROTOCOL,
            "frac_bits": int(frac_bits),
            "n_parties": int(n),
            "threshold": int(threshold),
            "neighbours": neighbours,
            "graph_seed": bytes(graph_seed).hex(),
        },
    )


@dataclass(frozen=True)
class _Config:
    frac_bits: int
    n_parties: int
    threshold: int
    neighbours: int | None
    graph_seed: bytes


def _config(params: SessionParams) -> _Config:
    bp = params.backend_params
    try:
        if bp.get("protocol") != PROTOCOL:
            raise ValueError
        cfg = _Config(
            int(bp["frac_bits"]), int(bp["n_parties"]), int(bp["threshold"]),
            None if bp.get("neighbours") is None else int(bp["neighbours"]), bytes.fromhex(bp["graph_seed"]),
        )
    except (KeyError, TypeError, ValueError):
        raise ParameterMismatch(
            "backend_params are not secagg parameters; build them with secagg_session_params()"
        ) from None
    # Re-run the full validation so hand-edited parameters cannot bypass it.
    again = secagg_session_params(
        params.session_id, params.layout, params.gamma, params.bounds, threshold=cfg.threshold,
        neighbours=cfg.neighbours, n_parties=cfg.n_parties, frac_bits=cfg.frac_bits, graph_seed=cfg.graph_seed,
    )
    if dict(again.backend_params) != dict(bp):
        raise ParameterMismatch("secagg backend_params are not in canonical form; rebuild them with secagg_session_params()")
    return cfg


def _permutation(n: int, seed: bytes) -> list[int]:
    """Fisher-Yates over ``1..n`` driven by ChaCha20 words (rejection sampling, no modulo bias)."""
    perm = list(range(1, n + 1))
    words = expand(seed, 2 * n + 64, domain=DOMAIN_GRAPH)
    pos = 0
    for i in range(n - 1, 0, -1):
        bound = i + 1
        limit = (1 << 64) - ((1 << 64) % bound)
        while True:
            if pos == len(words):
                words = expand(seed, 2 * len(words), domain=DOMAIN_GRAPH)
            w = int(words[pos])
            pos += 1
            if w < limit:
                break
        j = w % bound
        perm[i], perm[j] = perm[j], perm[i]
    return perm


@functools.lru_cache(maxsize=8)
def neighbour_graph(n_parties: int, neighbours: int | None, graph_seed: bytes) -> dict[int, frozenset[int]]:
    """Neighbour sets N(u) for ids ``1..n_parties``: complete, or a random Harary graph of even degree k.

    The Harary graph places the ids on a ring in the order of a public
    permutation derived from ``graph_seed`` and links each to its k/2 nearest
    ring neighbours on both sides; everybody computes the same graph.
    """
    ids = range(1, n_parties + 1)
    if neighbours is None or neighbours >= n_parties - 1:
        full = frozenset(ids)
        return {u: full - {u} for u in ids}
    perm = _permutation(n_parties, graph_seed)
    half = neighbours // 2
    graph = {}
    for i, u in enumerate(perm):
        graph[u] = frozenset(perm[(i + j) % n_parties] for j in range(-half, half + 1) if j != 0)
    return graph


# ---------------------------------------------------------------------------
# Messages
# ---------------------------------------------------------------------------
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


def _ids(v) -> tuple[int, ...]:
    if not isinstance(v, list) or any(isinstance(x, bool) or not isinstance(x, int) for x in v):
        raise ValueError("expected a list of ints")
    return tuple(v)


_REGISTRY: dict[str, type] = {}


class _Message:
    """Base: JSON-safe ``to_dict``/``from_dict`` and canonical-JSON ``to_bytes``/``from_bytes``."""

    TYPE: ClassVar[str]
    STAGE: ClassVar[str]
    session_id: str
    client_id: int

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        _REGISTRY[cls.TYPE] = cls

    def _body(self) -> dict:
        raise NotImplementedError

    @classmethod
    def _parse(cls, d: Mapping) -> "_Message":
        raise NotImplementedError

    def to_dict(self) -> dict:
        d = {"type": self.TYPE, "stage": self.STAGE, "session_id": self.session_id, "client_id": self.client_id}
        d.update(self._body())
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "_Message":
        if not isinstance(d, Mapping) or d.get("type") != cls.TYPE or d.get("stage") != cls.STAGE:
            raise MalformedPayload(f"not a {cls.TYPE} message")
        try:
            return cls._parse(d)
        except (KeyError, TypeError, ValueError, binascii.Error, AttributeError):
            raise MalformedPayload(f"malformed {cls.TYPE} message") from None

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "_Message":
        return cls.from_dict(_json(data))


def _json(data) -> Any:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError("message must be bytes")
    return parse_json(data, "secagg message")


def decode_message(data) -> _Message:
    """Parse any secagg message from bytes or a dict (masked inputs: the sealed envelope bytes)."""
    if isinstance(data, (bytes, bytearray, memoryview)) and bytes(data[:8]) == b"SAFLPAY1":
        return MaskedInput.from_bytes(bytes(data))
    d = data if isinstance(data, Mapping) else _json(data)
    cls = _REGISTRY.get(d.get("type")) if isinstance(d, Mapping) else None
    if cls is None:
        raise MalformedPayload("unknown secagg message type")
    return cls.from_dict(d)


@dataclass(frozen=True)
class SetupRequest(_Message):
    """Server -> hospital: join ``session_id`` as ``client_id`` under parameters ``params_digest``."""

    TYPE: ClassVar[str] = "secagg.setup_request"
    STAGE: ClassVar[str] = Stage.SETUP
    session_id: str
    client_id: int
    params_digest: str

    def _body(self):
        return {"params_digest": self.params_digest}

    @classmethod
    def _parse(cls, d):
        return cls(_str(d, "session_id"), _int(d, "client_id"), _str(d, "params_digest"))


@dataclass(frozen=True)
class SetupAck(_Message):
    """Hospital -> server: parameters checked, ready."""

    TYPE: ClassVar[str] = "secagg.setup_ack"
    STAGE: ClassVar[str] = Stage.SETUP
    session_id: str
    client_id: int
    params_digest: str

    def _body(self):
        return {"params_digest": self.params_digest}

    @classmethod
    def _parse(cls, d):
        return cls(_str(d, "session_id"), _int(d, "client_id"), _str(d, "params_digest"))


@dataclass(frozen=True)
class AdvertiseKeysRequest(_Message):
    """Server -> hospital: send your two public keys."""

    TYPE: ClassVar[str] = "secagg.advertise_keys_request"
    STAGE: ClassVar[str] = Stage.ADVERTISE_KEYS
    session_id: str
    client_id: int

    def _body(self):
        return {}

    @classmethod
    def _parse(cls, d):
        return cls(_str(d, "session_id"), _int(d, "client_id"))


@dataclass(frozen=True)
class KeyAdvertisement(_Message):
    """Hospital -> server (and relayed to neighbours): ``c_u^PK`` (share encryption), ``s_u^PK`` (masks)."""

    TYPE: ClassVar[str] = "secagg.key_advertisement"
    STAGE: ClassVar[str] = Stage.ADVERTISE_KEYS
    session_id: str
    client_id: int
    enc_public_key: bytes
    mask_public_key: bytes

    def _body(self):
        return {"enc_public_key": _b64(self.enc_public_key), "mask_public_key": _b64(self.mask_public_key)}

    @classmethod
    def _parse(cls, d):
        c, s = _unb64(d["enc_public_key"]), _unb64(d["mask_public_key"])
        if len(c) != _KEY_BYTES or len(s) != _KEY_BYTES:
            raise ValueError("public keys are 32 bytes")
        return cls(_str(d, "session_id"), _int(d, "client_id"), c, s)


@dataclass(frozen=True)
class ShareKeysRequest(_Message):
    """Server -> hospital: the advertisements of its share holders that advertised (U1), itself included."""

    TYPE: ClassVar[str] = "secagg.share_keys_request"
    STAGE: ClassVar[str] = Stage.SHARE_KEYS
    session_id: str
    client_id: int
    advertisements: tuple[KeyAdvertisement, ...]

    def _body(self):
        return {"advertisements": [a.to_dict() for a in self.advertisements]}

    @classmethod
    def _parse(cls, d):
        ads = d["advertisements"]
        if not isinstance(ads, list):
            raise ValueError("advertisements must be a list")
        return cls(_str(d, "session_id"), _int(d, "client_id"), tuple(KeyAdvertisement.from_dict(a) for a in ads))


@dataclass(frozen=True)
class EncryptedShare:
    """``ChaCha20Poly1305(k_uv, nonce, share(b_u)_v || share(s_u^SK)_v, ad(session, u -> v))``."""

    sender: int
    recipient: int
    nonce: bytes
    ciphertext: bytes

    def to_dict(self) -> dict:
        return {"sender": self.sender, "recipient": self.recipient, "nonce": _b64(self.nonce),
                "ciphertext": _b64(self.ciphertext)}

    @classmethod
    def from_dict(cls, d) -> "EncryptedShare":
        if not isinstance(d, Mapping):
            raise ValueError("share must be an object")
        nonce = _unb64(d["nonce"])
        if len(nonce) != _NONCE_BYTES:
            raise ValueError("nonce must be 12 bytes")
        return cls(_int(d, "sender"), _int(d, "recipient"), nonce, _unb64(d["ciphertext"]))


def _shares_list(v) -> tuple[EncryptedShare, ...]:
    if not isinstance(v, list):
        raise ValueError("shares must be a list")
    return tuple(EncryptedShare.from_dict(s) for s in v)


@dataclass(frozen=True)
class ShareKeysResponse(_Message):
    """Hospital -> server: one encrypted share pair per other share holder, for relaying."""

    TYPE: ClassVar[str] = "secagg.share_keys_response"
    STAGE: ClassVar[str] = Stage.SHARE_KEYS
    session_id: str
    client_id: int
    shares: tuple[EncryptedShare, ...]

    def _body(self):
        return {"shares": [s.to_dict() for s in self.shares]}

    @classmethod
    def _parse(cls, d):
        return cls(_str(d, "session_id"), _int(d, "client_id"), _shares_list(d["shares"]))


@dataclass(frozen=True)
class MaskedInputRequest(_Message):
    """Server -> hospital: the encrypted shares addressed to it by holders that completed SHARE_KEYS (U2)."""

    TYPE: ClassVar[str] = "secagg.masked_input_request"
    STAGE: ClassVar[str] = Stage.MASKED_INPUT
    session_id: str
    client_id: int
    shares: tuple[EncryptedShare, ...]

    def _body(self):
        return {"shares": [s.to_dict() for s in self.shares]}

    @classmethod
    def _parse(cls, d):
        return cls(_str(d, "session_id"), _int(d, "client_id"), _shares_list(d["shares"]))


@dataclass(frozen=True)
class MaskedInput(_Message):
    """Hospital -> server: the sealed masked vector ``y_u``.

    ``to_bytes`` is the sealed envelope itself (binary, 8 L bytes of body);
    ``to_dict`` carries it base64-encoded.
    """

    TYPE: ClassVar[str] = "secagg.masked_input"
    STAGE: ClassVar[str] = Stage.MASKED_INPUT
    session_id: str
    client_id: int
    payload: bytes

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
        return cls(sid, cid, bytes(data))


@dataclass(frozen=True)
class UnmaskRequest(_Message):
    """Server -> surviving hospital: reveal b-shares of ``survivors`` and key-shares of ``dropped``."""

    TYPE: ClassVar[str] = "secagg.unmask_request"
    STAGE: ClassVar[str] = Stage.UNMASK
    session_id: str
    client_id: int
    survivors: tuple[int, ...]
    dropped: tuple[int, ...]

    def _body(self):
        return {"survivors": list(self.survivors), "dropped": list(self.dropped)}

    @classmethod
    def _parse(cls, d):
        return cls(_str(d, "session_id"), _int(d, "client_id"), _ids(d["survivors"]), _ids(d["dropped"]))


@dataclass(frozen=True)
class UnmaskResponse(_Message):
    """Hospital -> server: ``{owner: share bytes}`` for the self-mask seeds and the mask keys asked for."""

    TYPE: ClassVar[str] = "secagg.unmask_response"
    STAGE: ClassVar[str] = Stage.UNMASK
    session_id: str
    client_id: int
    self_mask_shares: Mapping[int, bytes]
    mask_key_shares: Mapping[int, bytes]

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


# ---------------------------------------------------------------------------
# Masks
# ---------------------------------------------------------------------------
def _share_key(enc_sk: X25519PrivateKey, peer_pk: bytes, session_id: str, u: int, v: int) -> ChaCha20Poly1305:
    return ChaCha20Poly1305(agree(enc_sk, peer_pk, purpose="share-enc", session_id=session_id, u=u, v=v))


def _share_ad(backend: "SecAggBackend", sender: int, recipient: int) -> bytes:
    """AEAD associated data: session id, parameter digest and the direction sender -> recipient."""
    return f"secure-afl/secagg/v1/share/{backend.params.session_id}/{backend.digest_hex}/{sender}->{recipient}".encode()


def _pair_seed(mask_sk: X25519PrivateKey, peer_pk: bytes, session_id: str, u: int, v: int) -> bytes:
    return agree(mask_sk, peer_pk, purpose="mask", session_id=session_id, u=u, v=v)


def _raw_private(key: X25519PrivateKey) -> bytes:
    return key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def _raw_public(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def _add_pair_mask(acc: np.ndarray, seed: bytes, u: int, v: int, *, remove: bool = False) -> None:
    """``acc += sign(u, v) PRG(s_uv)`` (or ``-=`` with ``remove``), sign = +1 iff v > u."""
    m = expand(seed, acc.shape[0], domain=DOMAIN_PAIR_MASK)
    if (v > u) != remove:
        np.add(acc, m, out=acc)
    else:
        np.subtract(acc, m, out=acc)


# ---------------------------------------------------------------------------
# Hospital
# ---------------------------------------------------------------------------
_SOFT_ERRORS = (StageError, WrongSession, ParameterMismatch, MalformedPayload, TypeError)


class SecAggClient:
    """Hospital-side state machine for one secagg session.

    Each stage method takes the server's request and returns the response to
    send back; a request for any other stage than the next one raises
    :class:`StageError` and leaves the state unchanged. A request that fails a
    cryptographic or protocol check (:class:`InvalidContribution`,
    :class:`OverlappingUnmaskRequest`, :class:`InsufficientShares`) aborts the
    client for good.

    Parameters
    ----------
    params : SessionParams
        secagg session parameters.
    client_id : int
        This hospital's id in ``1..n_parties`` (also its Shamir x-coordinate).
    """

    def __init__(self, params: SessionParams, client_id: int):
        self.backend = SecAggBackend(params)
        self.params = params
        self.cfg = self.backend.cfg
        self.client_id = check_int("client_id", client_id, "SecAggClient", low=1, high=self.cfg.n_parties)
        self._stage = Stage.SETUP
        self._enc_sk: X25519PrivateKey | None = None
        self._mask_sk: X25519PrivateKey | None = None
        self._b: bytes | None = None
        self._ads: dict[int, KeyAdvertisement] = {}
        self._share_keys: dict[int, ChaCha20Poly1305] = {}
        self._held: dict[int, tuple[Share, Share]] = {}

    @classmethod
    def _from_parts(cls, params, client_id, *, enc_private: bytes, mask_private: bytes, self_mask_seed: bytes):
        """Deterministic seam for tests and vectors: fixed key pairs and self-mask seed."""
        c = cls(params, client_id)
        c._enc_sk = X25519PrivateKey.from_private_bytes(enc_private)
        c._mask_sk = X25519PrivateKey.from_private_bytes(mask_private)
        if len(self_mask_seed) != 32:
            raise ValueError("self_mask_seed must be 32 bytes")
        c._b = bytes(self_mask_seed)
        return c

    @property
    def stage(self) -> str:
        """The next stage this client accepts (``"done"`` / ``"aborted"`` at the end)."""
        return self._stage

    @property
    def holders(self) -> frozenset[int]:
        """H(u) = N(u) + {u}: who holds shares of this hospital's secrets."""
        return self.backend.holders(self.client_id)

    # -- dispatch --------------------------------------------------------------
    def handle(self, request: _Message, *, vector=None) -> _Message:
        """Answer any request (``vector`` is needed for MASKED_INPUT)."""
        stage = getattr(request, "STAGE", None)
        self._check_stage(stage)
        if stage == Stage.SETUP:
            return self.setup(request)
        if stage == Stage.ADVERTISE_KEYS:
            return self.advertise_keys(request)
        if stage == Stage.SHARE_KEYS:
            return self.share_keys(request)
        if stage == Stage.MASKED_INPUT:
            return self.masked_input(request, vector)
        return self.unmask(request)

    def _check_stage(self, received) -> None:
        if received != self._stage:
            raise StageError(
                f"Abort secure aggregation: expect {self._stage} stage, but receive {received} stage"
            )

    def _begin(self, request, cls) -> None:
        self._check_stage(getattr(request, "STAGE", None))
        if not isinstance(request, cls):
            raise TypeError(f"expected a {cls.__name__}")
        if request.session_id != self.params.session_id:
            raise WrongSession(f"request is for session {request.session_id!r}, not {self.params.session_id!r}")
        if request.client_id != self.client_id:
            raise MalformedPayload(f"request is addressed to client {request.client_id}, not {self.client_id}")

    def _run(self, fn, *args):
        try:
            return fn(*args)
        except _SOFT_ERRORS:
            raise
        except SecureAFLError:
            self._stage = _ABORTED
            raise

    # -- stage 0 ---------------------------------------------------------------
    def setup(self, request: SetupRequest) -> SetupAck:
        """Check the session parameters; draw the key pairs and the self-mask seed."""
        self._begin(request, SetupRequest)
        digest = self.params.digest().hex()
        if request.params_digest != digest:
            raise ParameterMismatch("the server runs this session under other parameters")
        if self._enc_sk is None:
            self._enc_sk = X25519PrivateKey.generate()
            self._mask_sk = X25519PrivateKey.generate()
            self._b = secrets.token_bytes(32)
        self._stage = Stage.ADVERTISE_KEYS
        return SetupAck(self.params.session_id, self.client_id, digest)

    # -- stage 1 ---------------------------------------------------------------
    def advertise_keys(self, request: AdvertiseKeysRequest) -> KeyAdvertisement:
        """Publish ``c_u^PK`` and ``s_u^PK``."""
        self._begin(request, AdvertiseKeysRequest)
        self._stage = Stage.SHARE_KEYS
        return self._advertisement()

    def _advertisement(self) -> KeyAdvertisement:
        return KeyAdvertisement(self.params.session_id, self.client_id, _raw_public(self._enc_sk),
                                _raw_public(self._mask_sk))

    # -- stage 2 ---------------------------------------------------------------
    def share_keys(self, request: ShareKeysRequest) -> ShareKeysResponse:
        """Shamir-share ``b_u`` and ``s_u^SK`` among the advertised holders; encrypt each pair to its holder."""
        self._begin(request, ShareKeysRequest)
        return self._run(self._share_keys_body, request)

    def _share_keys_body(self, request: ShareKeysRequest) -> ShareKeysResponse:
        u, t, sid = self.client_id, self.cfg.threshold, self.params.session_id
        holders = self.holders
        ads: dict[int, KeyAdvertisement] = {}
        for ad in request.advertisements:
            if ad.session_id != sid:
                raise WrongSession("an advertisement belongs to another session")
            if ad.client_id not in holders or ad.client_id in ads:
                raise MalformedPayload(f"unexpected or duplicate advertisement from client {ad.client_id}")
            ads[ad.client_id] = ad
        if ads.get(u) != self._advertisement():
            raise InvalidContribution()  # our own keys were not relayed faithfully
        keys = [a.enc_public_key for a in ads.values()] + [a.mask_public_key for a in ads.values()]
        if len(set(keys)) != len(keys):
            raise InvalidContribution()
        if len(ads) < t:
            raise InsufficientShares(f"only {len(ads)} share holders advertised keys; threshold is {t}")
        ids = sorted(ads)
        b_shares = create_shares(self._b, t, len(ids), indices=ids)
        s_shares = create_shares(_raw_private(self._mask_sk), t, len(ids), indices=ids)
        out = []
        for v, bs, ss in zip(ids, b_shares, s_shares):
            if v == u:
                self._held[u] = (bs, ss)
                continue
            aead = _share_key(self._enc_sk, ads[v].enc_public_key, sid, u, v)
            self._share_keys[v] = aead
            nonce = secrets.token_bytes(_NONCE_BYTES)
            ct = aead.encrypt(nonce, bs.to_bytes() + ss.to_bytes(), _share_ad(self.backend, u, v))
            out.append(EncryptedShare(u, v, nonce, ct))
        self._ads = {v: a for v, a in ads.items() if v != u}
        self._stage = Stage.MASKED_INPUT
        return ShareKeysResponse(sid, u, tuple(out))

    # -- stage 3 ---------------------------------------------------------------
    def masked_input(self, request: MaskedInputRequest, vector) -> MaskedInput:
        """Decrypt the shares held for peers, then upload ``y_u`` (see module docstring)."""
        self._begin(request, MaskedInputRequest)
        v = check_vector(self.params, vector)  # before any state change
        return self._run(self._masked_input_body, request, v)

    def _masked_input_body(self, request: MaskedInputRequest, vector: np.ndarray) -> MaskedInput:
        u, t, sid = self.client_id, self.cfg.threshold, self.params.session_id
        received: dict[int, tuple[Share, Share]] = {}
        for es in request.shares:
            if es.recipient != u or es.sender not in self._ads or es.sender in received:
                raise MalformedPayload(f"unexpected or duplicate share from client {es.sender}")
            try:
                pt = self._share_keys[es.sender].decrypt(es.nonce, es.ciphertext, _share_ad(self.backend, es.sender, u))
            except InvalidTag:
                raise InvalidContribution() from None
            try:
                n = len(pt) // 2
                if len(pt) % 2:
                    raise MalformedPayload("odd share length")
                bs, ss = Share.from_bytes(pt[:n]), Share.from_bytes(pt[n:])
            except MalformedPayload:
                raise InvalidContribution() from None
            if any(s.index != u or s.threshold != t or s.length != 32 for s in (bs, ss)):
                raise InvalidContribution()
            received[es.sender] = (bs, ss)
        if len(received) + 1 < t:
            raise InsufficientShares(f"only {len(received) + 1} holders completed share_keys; threshold is {t}")
        y = fixedpoint.encode(vector, self.cfg.frac_bits)
        np.add(y, expand(self._b, y.shape[0], domain=DOMAIN_SELF_MASK), out=y)
        for w in sorted(received):
            _add_pair_mask(y, _pair_seed(self._mask_sk, self._ads[w].mask_public_key, sid, u, w), u, w)
        self._held.update(received)
        self._stage = Stage.UNMASK
        payload = seal(self.params, "contribution", y.astype("<u8", copy=False).tobytes(), client_id=u,
                       stage=Stage.MASKED_INPUT)
        return MaskedInput(sid, u, payload)

    # -- stage 4 ---------------------------------------------------------------
    def unmask(self, request: UnmaskRequest) -> UnmaskResponse:
        """Reveal b-shares of survivors and key-shares of dropped peers; never both for one peer."""
        self._begin(request, UnmaskRequest)
        return self._run(self._unmask_body, request)

    def _unmask_body(self, request: UnmaskRequest) -> UnmaskResponse:
        u = self.client_id
        surv, drop = set(request.survivors), set(request.dropped)
        if len(surv) != len(request.survivors) or len(drop) != len(request.dropped):
            raise MalformedPayload("duplicate ids in the unmask request")
        if surv & drop or u in drop:
            self._stage = _ABORTED
            raise OverlappingUnmaskRequest(
                "the unmask request asks for both shares of the same hospital; refusing to answer"
            )
        unknown = (surv | drop) - set(self._held)
        if unknown:
            raise MalformedPayload(f"no shares held for clients {sorted(unknown)}")
        if len(surv) < self.cfg.threshold:
            raise InsufficientShares(f"only {len(surv)} survivors; threshold is {self.cfg.threshold}")
        self._stage = _DONE
        return UnmaskResponse(
            self.params.session_id, u,
            {o: self._held[o][0].to_bytes() for o in sorted(surv)},
            {o: self._held[o][1].to_bytes() for o in sorted(drop)},
        )


# ---------------------------------------------------------------------------
# Server
# ---------------------------------------------------------------------------
@dataclass
class UnmaskMaterial:
    """What the server reconstructed: enough to remove every mask from the survivors' sum, nothing more.

    ``self_mask_seeds[u]`` for u in survivors, ``dropped_mask_keys[v]`` (raw
    X25519 private key) for v in dropped, ``mask_public_keys`` of the
    survivors that masked with a dropped hospital.
    """

    survivors: tuple[int, ...]
    dropped: tuple[int, ...]
    self_mask_seeds: dict[int, bytes]
    dropped_mask_keys: dict[int, bytes]
    mask_public_keys: dict[int, bytes] = field(default_factory=dict)

    def to_dict(self) -> dict:
        enc = lambda m: {str(k): _b64(v) for k, v in sorted(m.items())}  # noqa: E731
        return {"survivors": list(self.survivors), "dropped": list(self.dropped),
                "self_mask_seeds": enc(self.self_mask_seeds), "dropped_mask_keys": enc(self.dropped_mask_keys),
                "mask_public_keys": enc(self.mask_public_keys)}

    @classmethod
    def from_dict(cls, d) -> "UnmaskMaterial":
        try:
            dec = lambda m: {int(k): _unb64(v) for k, v in m.items()}  # noqa: E731
            return cls(_ids(d["survivors"]), _ids(d["dropped"]), dec(d["self_mask_seeds"]),
                       dec(d["dropped_mask_keys"]), dec(d.get("mask_public_keys", {})))
        except (KeyError, TypeError, ValueError, AttributeError, binascii.Error):
            raise MalformedPayload("malformed unmask material") from None


class _SecAggCombiner(Combiner):
    """Running sum ``S = sum_u y_u mod 2^64`` (O(L) memory) plus the set of contributors."""

    def __init__(self, backend: "SecAggBackend", allowed: Iterable[int] | None = None):
        super().__init__()
        self._b = backend
        self._sum = np.zeros(backend.params.layout.length, dtype=np.uint64)
        self._allowed = None if allowed is None else frozenset(allowed)
        self.contributors: set[int] = set()

    def _add(self, payload) -> None:
        if isinstance(payload, MaskedInput):
            payload = payload.payload
        self._add_words(*self._b._decode_masked(payload))

    def _add_words(self, cid: int, words: np.ndarray) -> None:
        if self._allowed is not None and cid not in self._allowed:
            raise StageError(f"client {cid} is not expected to send a masked input")
        if cid in self.contributors:
            raise DuplicateContribution(f"client {cid} already sent its masked input")
        np.add(self._sum, words, out=self._sum)
        self.contributors.add(cid)

    def add_decoded(self, cid: int, words: np.ndarray) -> None:
        """``add`` for a payload the caller already opened with ``_decode_masked``."""
        if self._closed:
            raise RoundAlreadyClosed("combiner already produced its aggregate")
        self._add_words(cid, words)
        self.count += 1

    def _aggregate(self) -> bytes:
        return seal(self._b.params, "aggregate", self._sum.astype("<u8", copy=False).tobytes(),
                    contributors=sorted(self.contributors))


class SecAggServerRound:
    """Server side of one secagg round (no secrets until unmasking).

    The service relays, per stage: ``request(cid)`` to every active hospital,
    their responses to ``receive(msg)``, then calls ``close_stage()`` (after
    all answered or a deadline). ``close_stage`` decides who goes on (U0, U1,
    U2, the survivors U3 and dropped D, the responders U5), logs
    ``[Stage n]`` and raises :class:`InsufficientShares` (round aborted,
    nothing revealed) when some hospital is left with fewer than ``threshold``
    share holders. After the UNMASK stage closes, :attr:`aggregate_vector_`
    holds the revealed float64 sum and :attr:`fixed_point_sum_` the exact
    uint64 fixed-point sum.

    Parameters
    ----------
    params : SessionParams
    participants : iterable of int, optional
        Enrolled client ids (default ``1..n_parties``).
    """

    def __init__(self, params: SessionParams, *, participants: Iterable[int] | None = None):
        self.backend = SecAggBackend(params)
        self.params = params
        self.cfg = self.backend.cfg
        ids = range(1, self.cfg.n_parties + 1) if participants is None else participants
        self.participants = frozenset(check_int("participant", i, "SecAggServerRound", low=1,
                                                high=self.cfg.n_parties) for i in ids)
        self.stage = Stage.SETUP
        self.active: frozenset[int] = self.participants
        self._responded: set[int] = set()
        self._ads: dict[int, KeyAdvertisement] = {}
        self._inbox: dict[int, dict[int, EncryptedShare]] = {}
        self._combiner: _SecAggCombiner | None = None
        self._aggregate: bytes | None = None
        self._unmask_lists: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self._b_shares: dict[int, list[Share]] = {}
        self._s_shares: dict[int, list[Share]] = {}
        self.survivors_: tuple[int, ...] = ()
        self.dropped_: tuple[int, ...] = ()
        self.aggregate_vector_: np.ndarray | None = None
        self.fixed_point_sum_: np.ndarray | None = None

    # -- requests ---------------------------------------------------------------
    def request(self, client_id: int) -> _Message:
        """The request for ``client_id`` in the current stage."""
        self._check_open()
        if client_id not in self.active:
            raise StageError(f"client {client_id} takes no part in stage {self.stage}")
        sid, u = self.params.session_id, client_id
        if self.stage == Stage.SETUP:
            return SetupRequest(sid, u, self.params.digest().hex())
        if self.stage == Stage.ADVERTISE_KEYS:
            return AdvertiseKeysRequest(sid, u)
        if self.stage == Stage.SHARE_KEYS:
            ads = tuple(self._ads[v] for v in sorted(self.backend.holders(u) & self.active))
            return ShareKeysRequest(sid, u, ads)
        if self.stage == Stage.MASKED_INPUT:
            inbox = self._inbox.get(u, {})
            return MaskedInputRequest(sid, u, tuple(inbox[v] for v in sorted(inbox) if v in self.active))
        surv, drop = self._unmask_lists[u]
        return UnmaskRequest(sid, u, surv, drop)

    # -- responses --------------------------------------------------------------
    def receive(self, message) -> None:
        """Accept one hospital's response for the current stage."""
        self._check_open()
        if isinstance(message, (bytes, bytearray, memoryview, Mapping)):
            message = decode_message(message)
        if getattr(message, "STAGE", None) != self.stage:
            raise StageError(f"expect {self.stage} stage, but receive {getattr(message, 'STAGE', None)} stage")
        if message.session_id != self.params.session_id:
            raise WrongSession(f"message is for session {message.session_id!r}")
        u = message.client_id
        if u not in self.active:
            raise StageError(f"client {u} takes no part in stage {self.stage}")
        if u in self._responded:
            raise DuplicateContribution(f"client {u} already answered stage {self.stage}")
        handler = {
            Stage.SETUP: self._receive_setup, Stage.ADVERTISE_KEYS: self._receive_advertisement,
            Stage.SHARE_KEYS: self._receive_shares, Stage.MASKED_INPUT: self._receive_masked,
            Stage.UNMASK: self._receive_unmask,
        }[self.stage]
        expected = {Stage.SETUP: SetupAck, Stage.ADVERTISE_KEYS: KeyAdvertisement,
                    Stage.SHARE_KEYS: ShareKeysResponse, Stage.MASKED_INPUT: MaskedInput,
                    Stage.UNMASK: UnmaskResponse}[self.stage]
        if not isinstance(message, expected):
            raise MalformedPayload(f"expected a {expected.__name__}")
        handler(message)
        self._responded.add(u)

    def _receive_setup(self, m: SetupAck) -> None:
        if m.params_digest != self.params.digest().hex():
            raise ParameterMismatch("the hospital runs other session parameters")

    def _receive_advertisement(self, m: KeyAdvertisement) -> None:
        self._ads[m.client_id] = m

    def _receive_shares(self, m: ShareKeysResponse) -> None:
        u = m.client_id
        allowed = (self.backend.holders(u) & self.active) - {u}
        seen = set()
        for es in m.shares:
            if es.sender != u or es.recipient not in allowed or es.recipient in seen:
                raise MalformedPayload(f"client {u} sent a share for an unexpected recipient")
            seen.add(es.recipient)
        for es in m.shares:
            self._inbox.setdefault(es.recipient, {})[u] = es

    def _receive_masked(self, m: MaskedInput) -> None:
        cid, words = self.backend._decode_masked(m.payload)  # checks envelope, session, parameters, length
        if cid != m.client_id:
            raise MalformedPayload("masked input header names another client")
        self._combiner.add_decoded(cid, words)

    def _receive_unmask(self, m: UnmaskResponse) -> None:
        u = m.client_id
        surv, drop = self._unmask_lists[u]
        if not set(m.self_mask_shares) <= set(surv) or not set(m.mask_key_shares) <= set(drop):
            raise MalformedPayload("unmask response holds shares that were not asked for")
        parsed_b = {o: Share.from_bytes(b) for o, b in m.self_mask_shares.items()}
        parsed_s = {o: Share.from_bytes(b) for o, b in m.mask_key_shares.items()}
        for s in list(parsed_b.values()) + list(parsed_s.values()):
            if s.index != u or s.threshold != self.cfg.threshold or s.length != 32:
                raise InvalidContribution()
        for o, s in parsed_b.items():
            self._b_shares.setdefault(o, []).append(s)
        for o, s in parsed_s.items():
            self._s_shares.setdefault(o, []).append(s)

    # -- stage transitions --------------------------------------------------------
    def close_stage(self) -> bool:
        """Close the current stage; True when the round is complete, raises InsufficientShares on abort."""
        self._check_open()
        try:
            done = {
                Stage.SETUP: self._close_setup, Stage.ADVERTISE_KEYS: self._close_advertise_keys,
                Stage.SHARE_KEYS: self._close_share_keys, Stage.MASKED_INPUT: self._close_masked_input,
                Stage.UNMASK: self._close_unmask,
            }[self.stage]()
        except SecureAFLError:
            self.stage = _ABORTED  # forget everything share-related: an aborted round reveals nothing
            self._b_shares.clear()
            self._s_shares.clear()
            self._aggregate = None
            raise
        self._responded = set()
        return done

    def _prune(self, ids: set[int], what: str) -> frozenset[int]:
        """Drop hospitals left with fewer than t share holders (repeat until stable)."""
        t = self.cfg.threshold
        ids = set(ids)
        changed = True
        while changed:
            changed = False
            for u in sorted(ids):
                if len(self.backend.holders(u) & ids) < t:
                    ids.discard(u)
                    changed = True
        if len(ids) < t:
            raise InsufficientShares(f"only {len(ids)} hospitals {what}; threshold is {t}: round aborted")
        return frozenset(ids)

    def _advance(self, nxt: str, active: frozenset[int]) -> bool:
        n = Stage.index(self.stage)
        logger.info("[Stage %d] %s closed: %d of %d hospitals go on.", n, self.stage, len(active), len(self.active))
        self.active = active
        self.stage = nxt
        return False

    def _close_setup(self) -> bool:
        return self._advance(Stage.ADVERTISE_KEYS, self._prune(self._responded, "acknowledged setup"))

    def _close_advertise_keys(self) -> bool:
        return self._advance(Stage.SHARE_KEYS, self._prune(self._responded, "advertised keys"))

    def _close_share_keys(self) -> bool:
        u2 = self._prune(self._responded, "shared keys")
        self._combiner = _SecAggCombiner(self.backend, allowed=u2)
        return self._advance(Stage.MASKED_INPUT, u2)

    def _close_masked_input(self) -> bool:
        t = self.cfg.threshold
        u2, u3 = self.active, frozenset(self._combiner.contributors)
        dropped = u2 - u3
        for u in sorted(u2):  # every survivor's b_u and every dropped key must stay recoverable
            if len(self.backend.holders(u) & u3) < t:
                raise InsufficientShares(
                    f"client {u} has {len(self.backend.holders(u) & u3)} surviving share holders; threshold is {t}: "
                    "round aborted, nothing revealed"
                )
        self._aggregate = self._combiner.aggregate() if u3 else None
        self.survivors_, self.dropped_ = tuple(sorted(u3)), tuple(sorted(dropped))
        for u in u3:
            h = self.backend.holders(u)
            self._unmask_lists[u] = (tuple(sorted(h & u3)), tuple(sorted(h & dropped)))
        return self._advance(Stage.UNMASK, u3)

    def _close_unmask(self) -> bool:
        t = self.cfg.threshold
        for owner in self.survivors_:
            if len(self._b_shares.get(owner, ())) < t:
                raise InsufficientShares(f"fewer than {t} self-mask shares of client {owner}: round aborted")
        for owner in self.dropped_:
            if len(self._s_shares.get(owner, ())) < t:
                raise InsufficientShares(f"fewer than {t} mask-key shares of client {owner}: round aborted")
        material = self.unmask_material()
        self.fixed_point_sum_ = self.backend.unmask(self._aggregate, unmask=material)
        self.aggregate_vector_ = fixedpoint.decode(self.fixed_point_sum_, self.cfg.frac_bits)
        logger.info("[Stage 4] unmask closed: aggregate of %d hospitals revealed (%d dropped).",
                    len(self.survivors_), len(self.dropped_))
        self.stage = _DONE
        return True

    def unmask_material(self) -> UnmaskMaterial:
        """Reconstruct ``b_u`` (survivors) and ``s_v^SK`` (dropped) from the shares received."""
        seeds = {u: combine_shares(self._b_shares[u]) for u in self.survivors_}
        keys = {}
        for v in self.dropped_:
            raw = combine_shares(self._s_shares[v])
            if _raw_public(X25519PrivateKey.from_private_bytes(raw)) != self._ads[v].mask_public_key:
                raise InvalidContribution()
            keys[v] = raw
        need = set()
        for v in self.dropped_:
            need |= self.backend.graph[v] & set(self.survivors_)
        pks = {u: self._ads[u].mask_public_key for u in sorted(need)}
        return UnmaskMaterial(self.survivors_, self.dropped_, seeds, keys, pks)

    @property
    def aggregate(self) -> bytes | None:
        """The sealed masked sum (available once MASKED_INPUT closed)."""
        return self._aggregate

    def _check_open(self) -> None:
        if self.stage in (_DONE, _ABORTED):
            raise RoundAlreadyClosed(f"the secagg round is {self.stage}")


# ---------------------------------------------------------------------------
# Backend
# ---------------------------------------------------------------------------
class SecAggBackend(ProtectionBackend):
    """``secagg`` behind the common :class:`ProtectionBackend` interface.

    * hospital: ``protect(vector, client=SecAggClient, request=MaskedInputRequest) -> bytes``
    * server:   ``combiner()`` sums masked inputs mod 2^64 (O(L) memory)
    * server:   ``reveal(aggregate, unmask=UnmaskMaterial) -> float64 vector``
    """

    name = "secagg"

    def __init__(self, params: SessionParams):
        super().__init__(params)
        self.cfg = _config(params)
        self.digest_hex = params.digest().hex()
        self._graph: dict[int, frozenset[int]] | None = None

    @property
    def graph(self) -> dict[int, frozenset[int]]:
        if self._graph is None:
            self._graph = neighbour_graph(self.cfg.n_parties, self.cfg.neighbours, self.cfg.graph_seed)
        return self._graph

    def holders(self, u: int) -> frozenset[int]:
        return self.graph[u] | {u}

    def protect(self, vector, *, client: SecAggClient, request: MaskedInputRequest, **kw) -> bytes:
        """Hospital: the sealed masked input ``y_u`` (runs the client's MASKED_INPUT stage)."""
        if not isinstance(client, SecAggClient):
            raise TypeError("client must be a SecAggClient")
        if client.params.digest() != self.params.digest():
            raise ParameterMismatch("the client runs other session parameters")
        return client.masked_input(request, vector).to_bytes()

    def combiner(self, *, allowed: Iterable[int] | None = None, **kw) -> Combiner:
        return _SecAggCombiner(self, allowed)

    def _decode_masked(self, payload) -> tuple[int, np.ndarray]:
        env = open_envelope(self.params, payload, "contribution")
        cid = env.header.get("client_id")
        if env.header.get("stage") != Stage.MASKED_INPUT or isinstance(cid, bool) or not isinstance(cid, int):
            raise MalformedPayload("not a secagg masked input")
        if len(env.body) != 8 * self.params.layout.length:
            raise MalformedPayload("masked input has the wrong length")
        return cid, np.frombuffer(env.body, dtype="<u8").astype(np.uint64)

    def unmask(self, aggregate: bytes, *, unmask: UnmaskMaterial) -> np.ndarray:
        """The exact fixed-point sum (uint64) of the survivors, masks removed (module docstring)."""
        if isinstance(unmask, Mapping):
            unmask = UnmaskMaterial.from_dict(unmask)
        if not isinstance(unmask, UnmaskMaterial):
            raise TypeError("unmask must be an UnmaskMaterial")
        env = open_envelope(self.params, aggregate, "aggregate")
        if len(env.body) != 8 * self.params.layout.length:
            raise MalformedPayload("aggregate has the wrong length")
        surv = tuple(sorted(unmask.survivors))
        if list(surv) != env.header.get("contributors") or set(surv) & set(unmask.dropped):
            raise InvalidInputError("unmask material does not match the aggregate's contributors")
        if set(unmask.self_mask_seeds) != set(surv) or set(unmask.dropped_mask_keys) != set(unmask.dropped):
            raise InvalidInputError("unmask material is incomplete")
        total = np.frombuffer(env.body, dtype="<u8").astype(np.uint64)
        L = total.shape[0]
        for u in surv:
            np.subtract(total, expand(unmask.self_mask_seeds[u], L, domain=DOMAIN_SELF_MASK), out=total)
        sid, survivors = self.params.session_id, set(surv)
        for v in sorted(unmask.dropped):
            sk = X25519PrivateKey.from_private_bytes(unmask.dropped_mask_keys[v])
            for u in sorted(self.graph[v] & survivors):
                seed = _pair_seed(sk, unmask.mask_public_keys[u], sid, v, u)
                _add_pair_mask(total, seed, u, v, remove=True)
        return total

    def reveal(self, aggregate: bytes, *, unmask: UnmaskMaterial, **kw) -> np.ndarray:
        """``dec(unmask(aggregate))``: float64 sum of the survivors' vectors."""
        return fixedpoint.decode(self.unmask(aggregate, unmask=unmask), self.cfg.frac_bits)


# ---------------------------------------------------------------------------
# In-process simulation (benchmark entry point)
# ---------------------------------------------------------------------------
def simulate_round(params: SessionParams, vectors: Sequence, dropout: float = 0.0, rng=None):
    """Run the whole protocol in-process for ``K = len(vectors)`` hospitals (ids 1..K).

    Parameters
    ----------
    params : SessionParams
        From :func:`secagg_session_params` with ``n_parties >= K``.
    vectors : sequence of K float64 vectors of length L
        Indexed lazily (``vectors[i]``), so a generator-backed sequence keeps
        memory at O(L).
    dropout : float in [0, 1)
        Fraction of hospitals (``round(dropout * K)``, chosen by ``rng``) that
        drop after SHARE_KEYS, before sending their masked input.
    rng : numpy Generator, int or None
        Chooses who drops.

    Returns
    -------
    aggregate : ndarray of float64
        Revealed sum of the survivors' vectors.
    exact : bool
        Revealed fixed-point sum == plaintext fixed-point sum of the survivors, bit for bit.
    timings : dict
        Seconds: ``setup``, ``advertise_keys``, ``share_keys``, ``protect_total``,
        ``protect_per_client`` (MASKED_INPUT stage of one hospital: decrypt shares,
        encode, masks, seal), ``combine`` (server streaming sum),
        ``unmask_clients``, ``reveal`` (reconstruction + mask removal), ``total``;
        plus ``survivors``: the 0-based indices of the summed vectors.
    bytes_per_client : int
        Mean bytes a surviving hospital uploads over all five stages.

    Raises
    ------
    InsufficientShares
        Dropout left some hospital with fewer than ``threshold`` surviving
        share holders: the round aborts and nothing is revealed.
    """
    backend = SecAggBackend(params)
    K = len(vectors)
    if not 2 <= K <= backend.cfg.n_parties:
        raise InvalidParameterError(
            f"simulate_round needs 2 <= K <= n_parties={backend.cfg.n_parties} vectors; got K={K}"
        )
    dropout = check_real("dropout", dropout, "simulate_round", low=0.0)
    if dropout >= 1.0:
        raise param_error("dropout", "simulate_round", "a float in the range [0, 1)", dropout)
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    ids = list(range(1, K + 1))
    n_drop = int(round(dropout * K))
    drops = set(int(i) for i in gen.choice(ids, size=n_drop, replace=False)) if n_drop else set()
    timings: dict[str, float] = {}
    up = {u: 0 for u in ids}
    t_start = time.perf_counter()

    server = SecAggServerRound(params, participants=ids)
    clients = {u: SecAggClient(params, u) for u in ids}

    def run_stage(name: str, answer) -> None:
        t0 = time.perf_counter()
        for u in sorted(server.active):
            resp = answer(u, server.request(u))
            if resp is None:
                continue
            data = resp.to_bytes()
            up[u] += len(data)
            server.receive(decode_message(data))
        server.close_stage()
        timings[name] = time.perf_counter() - t0

    run_stage("setup", lambda u, r: clients[u].setup(r))
    run_stage("advertise_keys", lambda u, r: clients[u].advertise_keys(r))
    run_stage("share_keys", lambda u, r: clients[u].share_keys(r))

    # Stage 3: survivors mask and upload; the server streams them into its sum.
    protect_s, combine_s = 0.0, 0.0
    reference = np.zeros(params.layout.length, dtype=np.uint64)
    t0 = time.perf_counter()
    for u in sorted(server.active):
        req = server.request(u)
        if u in drops:
            continue
        vec = vectors[u - 1]
        a = time.perf_counter()
        payload = backend.protect(vec, client=clients[u], request=req)
        b = time.perf_counter()
        server.receive(MaskedInput.from_bytes(payload))
        c = time.perf_counter()
        protect_s += b - a
        combine_s += c - b
        up[u] += len(payload)
        np.add(reference, fixedpoint.encode(vec, backend.cfg.frac_bits), out=reference)
    a = time.perf_counter()
    server.close_stage()
    combine_s += time.perf_counter() - a
    timings["masked_input"] = time.perf_counter() - t0
    n_surv = len(server.survivors_)
    timings["protect_total"] = protect_s
    timings["protect_per_client"] = protect_s / max(n_surv, 1)
    timings["combine"] = combine_s

    t0 = time.perf_counter()
    responses = []
    for u in sorted(server.active):
        data = clients[u].unmask(server.request(u)).to_bytes()
        up[u] += len(data)
        responses.append(data)
    timings["unmask_clients"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for data in responses:
        server.receive(decode_message(data))
    server.close_stage()
    timings["reveal"] = time.perf_counter() - t0
    timings["total"] = time.perf_counter() - t_start

    exact = bool(np.array_equal(server.fixed_point_sum_, reference))
    timings["survivors"] = [u - 1 for u in server.survivors_]  # 0-based indices into ``vectors``
    bytes_per_client = int(round(sum(up[u] for u in server.survivors_) / max(n_surv, 1)))
    return server.aggregate_vector_, exact, timings, bytes_per_client
