"""CKKS ciphertexts in SEAL's own binary form: contexts, the session's chunk wire format, and the
ciphertext bytes SEAL loads (the layer under :mod:`secure_afl.hazmat.ckks`; the analysis is there).

SEAL saves a ciphertext as a 16-byte header (magic 0xA15E, header size, version, compression mode, size),
then its members: parms_id, NTT flag, size, N, the number of primes, scale, correction factor, and the
residue array as a DynArray with its own header. The session's chunk form keeps only the residues, each
prime's at its real bit width; everything else is the session's and is never read from the wire.
"""

from __future__ import annotations

import functools
import math
import os
import struct
import tempfile
from typing import Iterable, Sequence

import numpy as np
import tenseal as ts
import tenseal.sealapi as sealapi

from .. import domains
from ..exceptions import InvalidContribution, InvalidParameterError, ParameterMismatch
from ._tenseal import check_chunks, first_parms_id, frame, parse_context, split_body
from ._tenseal import decrypt_chunks as _decrypt_chunks


SEAL_MAGIC = 0xA15E
SEAL_HEADER = struct.Struct("<HBBBBHQ")  # magic, header size, version major, minor, compression, reserved, size


@functools.lru_cache(maxsize=1)
def seal_version() -> bytes:
    """SEAL's serialisation version bytes (major, minor), read from a ciphertext SEAL itself saved."""
    with tempfile.TemporaryDirectory(prefix="safl-seal-") as tmp:
        path = os.path.join(tmp, "ct")
        sealapi.Ciphertext().save(path)
        with open(path, "rb") as f:
            return f.read(SEAL_HEADER.size)[3:5]


def seal_ciphertext(parms_id, ntt: bool, n: int, levels: int, scale: float, data: np.ndarray) -> bytes:
    """An uncompressed SEAL ``Ciphertext::save`` of a size-2 ciphertext holding ``data`` (uint64,
    [poly][prime][coefficient]): header, parms_id, NTT flag, size, N, primes, scale, correction factor 1,
    then the coefficient array (itself a headed SEAL DynArray)."""
    major, minor = seal_version()
    arr = struct.pack("<Q", data.size) + np.ascontiguousarray(data, dtype=np.uint64).tobytes()
    dyn = SEAL_HEADER.pack(SEAL_MAGIC, SEAL_HEADER.size, major, minor, 0, 0, SEAL_HEADER.size + len(arr)) + arr
    members = (struct.pack("<4Q", *parms_id) + (b"\x01" if ntt else b"\x00")
               + struct.pack("<QQQdQ", 2, n, levels, float(scale), 1) + dyn)
    return SEAL_HEADER.pack(SEAL_MAGIC, SEAL_HEADER.size, major, minor, 0, 0,
                             SEAL_HEADER.size + len(members)) + members


# -- contexts ------------------------------------------------------------------
def generate_context(params) -> "ts.Context":
    """A FRESH asymmetric CKKS context (secret + public key) for ``params``."""
    ctx = ts.context(
        ts.SCHEME_TYPE.CKKS,
        poly_modulus_degree=params.poly_modulus_degree,
        coeff_mod_bit_sizes=list(params.coeff_mod_bit_sizes),
    )
    ctx.global_scale = params.scale
    _check_context(ctx, params)
    return ctx


def load_context(data: bytes, params, *, secret: bool) -> "ts.Context":
    """Parse a serialized context and check it against ``params``.

    ``secret=False`` refuses a context holding a secret key
    (:class:`SecretKeyNotAllowed`); ``secret=True`` requires one
    (:class:`InvalidKey`). Unparsable bytes raise :class:`MalformedPayload`;
    a context for other parameters :class:`ParameterMismatch`.
    """
    ctx = parse_context(data, secret=secret)
    _check_context(ctx, params)
    return ctx


def _check_context(ctx: "ts.Context", params) -> None:
    try:
        sc = ctx.seal_context().data
        first, key = sc.first_context_data(), sc.key_context_data()
        got = (
            first.parms().poly_modulus_degree(),
            first.chain_index() + 1,
            first.total_coeff_modulus_bit_count(),
            key.total_coeff_modulus_bit_count(),
            float(ctx.global_scale),
        )
    except Exception:
        raise ParameterMismatch("context does not carry CKKS parameters with a global scale") from None
    n, l_data, d_bits, k_bits, scale = got
    total = sum(params.coeff_mod_bit_sizes)
    ok = (
        n == params.poly_modulus_degree
        and l_data == params.n_data_primes
        and params.data_bits - params.n_data_primes < d_bits <= params.data_bits
        and total - len(params.coeff_mod_bit_sizes) < k_bits <= total
        and scale == params.scale
    )
    if not ok:
        raise ParameterMismatch(
            f"context parameters (N={n}, data primes={l_data}, data bits={d_bits}, scale=2^{math.log2(scale):g}) "
            f"do not match the session's {params.to_dict()}"
        )


# -- ciphertext chunks -------------------------------------------------------------
_BODY_MAGIC = domains.CKKS_BODY_MAGIC


# -- the wire form of one chunk ----------------------------------------------------------------------
_COUNT = struct.Struct("<I")


def primes_of(ctx: "ts.Context") -> list:
    return [m.value() for m in ctx.seal_context().data.first_context_data().parms().coeff_modulus()]


def _varint(x: int) -> bytes:
    out = bytearray()
    while True:
        b, x = x & 0x7F, x >> 7
        out.append(b | (0x80 if x else 0))
        if not x:
            return bytes(out)


def _varint_at(buf: bytes, pos: int) -> tuple[int, int]:
    x = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise InvalidParameterError("not a TenSEAL CKKS vector")
        b = buf[pos]
        x, pos, shift = x | (b & 0x7F) << shift, pos + 1, shift + 7
        if not b & 0x80:
            return x, pos


def ciphertext_words(vec, n: int, levels: int) -> np.ndarray:
    """The residues of a fresh two-polynomial ciphertext, [poly][prime][coefficient], read from TenSEAL's
    own serialisation (SEAL's ``Ciphertext::save``, the inverse of :func:`seal_ciphertext`) in one pass:
    the element accessor costs a Python call per residue (32 768 per chunk at N = 8192)."""
    proto = vec.serialize()
    pos = 0
    if proto[:1] != b"\x0a":
        raise InvalidParameterError("not a TenSEAL CKKS vector")
    skip, pos = _varint_at(proto, 1)
    pos += skip
    if proto[pos:pos + 1] != b"\x12":
        raise InvalidParameterError("not a TenSEAL CKKS vector")
    length, pos = _varint_at(proto, pos + 1)
    seal_bytes = proto[pos:pos + length]
    magic, hsize, _, _, mode, _, size = SEAL_HEADER.unpack_from(seal_bytes)
    if magic != SEAL_MAGIC or hsize != SEAL_HEADER.size or size != len(seal_bytes):
        raise InvalidParameterError("not a SEAL ciphertext")
    body = seal_bytes[hsize:]
    if mode == 1:
        import zlib

        body = zlib.decompress(body)
    elif mode == 2:
        import zstandard

        body = zstandard.ZstdDecompressor().decompress(body, max_output_size=64 + 16 * 2 * levels * n + 64)
    elif mode != 0:
        raise InvalidParameterError(f"SEAL compression mode {mode} is not one this reader knows")
    off = 32 + 1  # parms_id, NTT flag
    size, poly_n, lv = struct.unpack_from("<QQQ", body, off)
    off += 40 + SEAL_HEADER.size  # size, N, levels, scale, correction factor; then the DynArray's own header
    (count,) = struct.unpack_from("<Q", body, off)
    if (size, poly_n, lv, count) != (2, n, levels, 2 * levels * n):
        raise InvalidParameterError("not a fresh two-polynomial ciphertext of this context")
    return np.frombuffer(body, dtype=np.uint64, count=count, offset=off + 8).copy()


def pack_chunk(vec) -> bytes:
    """One fresh-level ciphertext chunk as ``u32 values | c0, c1 residues``, each prime's N residues
    bit-packed at that prime's bit length. Parameter id, scale, size and N are the session's and are
    not sent (:func:`unpack_chunk` sets them), so a chunk cannot claim another level or scale; and the
    residues take their real width on the wire (SEAL's own zstd-compressed form stores a 33-40-bit
    residue in about 41-47 bits)."""
    ct = vec.ciphertext()[0]
    primes = primes_of(vec.context())
    n, levels = ct.poly_modulus_degree(), len(primes)
    if ct.size() != 2 or ct.coeff_modulus_size() != levels:
        raise InvalidParameterError("not a fresh two-polynomial ciphertext of this context")
    data = ciphertext_words(vec, n, levels).reshape(2 * levels, n)
    out = [_COUNT.pack(vec.size())]
    for row in range(2 * levels):
        bits = primes[row % levels].bit_length()
        planes = (data[row][:, None] >> np.arange(bits, dtype=np.uint64)) & np.uint64(1)
        out.append(np.packbits(planes.astype(np.uint8).ravel(), bitorder="little").tobytes())
    return b"".join(out)


def unpack_chunk(ctx: "ts.Context", params, blob: bytes):
    """:func:`pack_chunk`'s bytes back to a ``CKKSVector`` under ``ctx`` at the session's first level and
    scale. A wrong length raises :class:`InvalidContribution`; a residue not below its prime is refused by
    SEAL's own validity check when the ciphertext is loaded (the caller turns that into the same error)."""
    primes = primes_of(ctx)[:params.n_data_primes]
    n, levels = params.poly_modulus_degree, len(primes)
    sizes = [-(-n * q.bit_length() // 8) for q in primes] * 2
    if len(blob) != _COUNT.size + sum(sizes):
        raise InvalidContribution()
    (count,) = _COUNT.unpack_from(blob)
    if not 1 <= count <= params.slots:
        raise InvalidContribution()
    rows, pos = [], _COUNT.size
    for row, size in enumerate(sizes):
        bits = primes[row % levels].bit_length()
        planes = np.unpackbits(np.frombuffer(blob, dtype=np.uint8, count=size, offset=pos),
                               bitorder="little")[:n * bits].reshape(n, bits).astype(np.uint64)
        vals = (planes << np.arange(bits, dtype=np.uint64)).sum(axis=1, dtype=np.uint64)
        rows.append(vals)
        pos += size
    seal_bytes = seal_ciphertext(ctx.seal_context().data.first_parms_id(), True, n, levels, params.scale,
                                  np.concatenate(rows))
    proto = (b"\x0a" + _varint(len(_varint(count))) + _varint(count) + b"\x12" + _varint(len(seal_bytes))
             + seal_bytes + b"\x19" + struct.pack("<d", params.scale))
    return ts.ckks_vector_from(ctx, proto)


def encrypt_vector(ctx: "ts.Context", params, vector: np.ndarray,
                   breaks: Sequence[int] = ()) -> bytes:
    """Encrypt a float64 vector chunk by chunk (:meth:`CKKSParameters.spans`) under ``ctx``'s public key.

    Body format: ``b"SAFLCKK1" | u32 n_chunks | u32 L | (u64 len | chunk)*``.
    The caller has checked the vector against the declared bound.
    """
    v = np.ascontiguousarray(vector, dtype=np.float64)
    blobs = []
    for start, stop in params.spans(v.shape[0], breaks):
        try:
            blob = pack_chunk(ts.ckks_vector(ctx, v[start:stop]))
        except Exception:
            raise InvalidParameterError("TenSEAL refused to encrypt the vector under this context") from None
        blobs.append(blob)
    return frame(_BODY_MAGIC, blobs, v.shape[0])


def load_chunks(ctx: "ts.Context", params, body: bytes, length: int,
                breaks: Sequence[int] = ()) -> list:
    """Parse and check every chunk; all-or-nothing.

    Each chunk must deserialize under ``ctx`` and be a fresh-level ciphertext
    of this session: 2 polynomials, NTT form, the first data level (a
    ciphertext switched to a lower level would have a smaller Q and less
    headroom), scale exactly 2^s and the number of values its span
    (:meth:`CKKSParameters.spans`) holds.
    Framing errors raise :class:`MalformedPayload`; anything wrong with a
    ciphertext raises a detail-free :class:`InvalidContribution`.
    """
    spans = params.spans(length, breaks)
    blobs = split_body(body, _BODY_MAGIC, len(spans), length, "ckks")
    first_id = first_parms_id(ctx, "CKKS")

    def fresh(ct) -> bool:
        return (ct.size() == 2 and ct.is_ntt_form() and list(ct.parms_id()) == first_id
                and ct.scale == params.scale and ct.poly_modulus_degree() == params.poly_modulus_degree)

    return check_chunks(blobs, params.slots, length, lambda b: unpack_chunk(ctx, params, b), fresh,
                        sizes=[b - a for a, b in spans])


def dump_chunks(chunks: Sequence, length: int) -> bytes:
    return frame(_BODY_MAGIC, [pack_chunk(c) for c in chunks], length)


def decrypt_chunks(ctx: "ts.Context", chunks: Iterable, length: int) -> np.ndarray:
    """Decrypt and concatenate to a float64 vector of ``length``."""
    return _decrypt_chunks(chunks, length, np.float64)
