"""Packing statistics into one flat float64 vector, and back.

Layout v1 for dimension d and C classes (length L = d(d+1)/2 + dC + C + 2 + 4)::

    [ triu(C^r) row-major | Q row-major | n | counts[0..C-1] | contributors | tag[0..3] ]

Only the upper triangle of the symmetric Gram is sent. ``contributors`` is 1
for a hospital, so the aggregate itself says how many hospitals were summed
(the K in RI restoration, eq. (16)) and the key holder can cross-check it
against the manifest. ``tag`` is a random check value a ckks hospital also
sends, sealed and signed, to the key holder (:mod:`secure_afl.tagging`): the
decrypted aggregate must carry the sum of the manifest's tags, which a server
that forges an "aggregate" from fewer ciphertexts cannot produce. Hospitals
under other backends leave it zero.

The byte form prefixes a 32-byte header (magic, layout version, d, C, L) so a
vector for another layout is refused with :class:`LayoutMismatch` instead of
being silently misread.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import numpy as np

from . import domains
from ._validation import check_int
from .exceptions import LayoutMismatch, MalformedPayload
from .stats import TAG_SLOTS, SufficientStatistics

__all__ = ["Layout", "LAYOUT_VERSION", "TAG_SLOTS"]

LAYOUT_VERSION = 1
_MAGIC = domains.PACKED_STATS_MAGIC
_HEADER = struct.Struct("<8sIIIQ4x")  # magic, version, d, C, L, pad -> 32 bytes


@dataclass(frozen=True)
class Layout:
    """Where each statistic lives in the packed vector."""

    dim: int
    n_classes: int
    version: int = LAYOUT_VERSION

    def __post_init__(self):
        check_int("dim", self.dim, "Layout", low=1, high=65536)
        check_int("n_classes", self.n_classes, "Layout", low=1, high=1_000_000)
        if self.version != LAYOUT_VERSION:
            raise LayoutMismatch(f"unsupported layout version {self.version}; this build reads v{LAYOUT_VERSION}")

    # -- geometry --------------------------------------------------------
    @property
    def n_gram(self) -> int:
        return self.dim * (self.dim + 1) // 2

    @property
    def n_cross(self) -> int:
        return self.dim * self.n_classes

    @property
    def length(self) -> int:
        return self.n_gram + self.n_cross + self.n_classes + 2 + TAG_SLOTS

    @property
    def slices(self) -> dict[str, slice]:
        g, q, c = self.n_gram, self.n_cross, self.n_classes
        return {
            "gram": slice(0, g),
            "cross": slice(g, g + q),
            "n": slice(g + q, g + q + 1),
            "counts": slice(g + q + 1, g + q + 1 + c),
            "contributors": slice(g + q + 1 + c, g + q + 2 + c),
            "tag": slice(g + q + 2 + c, g + q + 2 + c + TAG_SLOTS),
        }

    @property
    def layout_id(self) -> str:
        return f"afl-stats/v{self.version}/d={self.dim}/C={self.n_classes}"

    @property
    def digest(self) -> bytes:
        return hashlib.sha256(self.layout_id.encode()).digest()

    # -- vector form -------------------------------------------------------
    def pack(self, stats: SufficientStatistics) -> np.ndarray:
        """Flatten ``stats`` into a float64 vector of length :attr:`length`."""
        if stats.gram.shape != (self.dim, self.dim) or stats.cross.shape != (self.dim, self.n_classes):
            raise LayoutMismatch(
                f"statistics have d={stats.gram.shape[0]}, C={stats.cross.shape[1]}; layout is {self.layout_id}"
            )
        iu = np.triu_indices(self.dim)
        s = self.slices
        v = np.empty(self.length, dtype=np.float64)
        v[s["gram"]] = stats.gram[iu]
        v[s["cross"]] = stats.cross.ravel()
        v[s["n"]] = stats.n
        v[s["counts"]] = stats.class_counts
        v[s["contributors"]] = stats.contributors
        v[s["tag"]] = 0.0 if stats.tag is None else stats.tag
        return v

    def unpack(self, vector: np.ndarray, *, gamma: float = 0.0) -> SufficientStatistics:
        """Inverse of :meth:`pack` (exact round trip)."""
        v = np.asarray(vector, dtype=np.float64)
        if v.ndim != 1 or v.shape[0] != self.length:
            raise LayoutMismatch(f"vector of length {v.shape} does not match {self.layout_id} (L={self.length})")
        s = self.slices
        gram = np.zeros((self.dim, self.dim), dtype=np.float64)
        iu = np.triu_indices(self.dim)
        gram[iu] = v[s["gram"]]
        gram.T[iu] = v[s["gram"]]
        cross = v[s["cross"]].reshape(self.dim, self.n_classes).copy()
        return SufficientStatistics(
            gram, cross, float(v[s["n"]][0]), v[s["counts"]].copy(), float(v[s["contributors"]][0]), gamma,
            v[s["tag"]].copy(),
        )

    # -- byte form -------------------------------------------------------------
    def header(self) -> bytes:
        return _HEADER.pack(_MAGIC, self.version, self.dim, self.n_classes, self.length)

    def to_bytes(self, vector: np.ndarray) -> bytes:
        v = np.asarray(vector, dtype="<f8")
        if v.shape != (self.length,):
            raise LayoutMismatch(f"vector shape {v.shape} does not match {self.layout_id}")
        return self.header() + v.tobytes()

    def from_bytes(self, data: bytes) -> np.ndarray:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError("data must be bytes")
        data = bytes(data)
        if len(data) < _HEADER.size:
            raise MalformedPayload("packed statistics truncated before the header ends")
        magic, version, d, c, length = _HEADER.unpack_from(data)
        if magic != _MAGIC:
            raise MalformedPayload("not a packed-statistics blob (bad magic)")
        if (version, d, c, length) != (self.version, self.dim, self.n_classes, self.length):
            raise LayoutMismatch(
                f"blob layout afl-stats/v{version}/d={d}/C={c} (L={length}) does not match {self.layout_id}"
            )
        body = data[_HEADER.size:]
        if len(body) != 8 * self.length:
            raise MalformedPayload(f"packed statistics body has {len(body)} bytes, expected {8 * self.length}")
        return np.frombuffer(body, dtype="<f8").astype(np.float64)
