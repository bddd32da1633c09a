"""TenSEAL plumbing shared by the CKKS and BFV hazmat modules.

.. danger::

   Hazardous Materials: used only by :mod:`secure_afl.hazmat.ckks` and
   :mod:`secure_afl.hazmat.bfv`, which check parameters and ciphertexts.

Both schemes serialise contexts the same way, refuse a context by the same
rules (a secret key where only the public one may be, no public key), and
frame a ciphertext body identically apart from its magic::

    magic (8 bytes) | u32 n_chunks | u32 L | (u64 len | chunk)*

Keeping one copy means one set of refusals to test and no way for the two
formats to drift apart.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Callable, Sequence

import numpy as np
import tenseal as ts

from ..exceptions import InvalidContribution, InvalidKey, MalformedPayload, ParameterMismatch, SecretKeyNotAllowed

BODY_HEAD = struct.Struct("<8sII")  # magic, number of chunks, total length L
CHUNK_LEN = struct.Struct("<Q")
MAX_CHUNK_BYTES = 1 << 28


def serialize_public(ctx: "ts.Context") -> bytes:
    """Public key and parameters only: no secret, relinearisation or Galois keys."""
    return ctx.serialize(save_public_key=True, save_secret_key=False, save_galois_keys=False, save_relin_keys=False)


def serialize_secret(ctx: "ts.Context") -> bytes:
    """Secret and public key (no relinearisation / Galois keys). Handle as key material."""
    if not ctx.has_secret_key():
        raise InvalidKey("context holds no secret key")
    return ctx.serialize(save_public_key=True, save_secret_key=True, save_galois_keys=False, save_relin_keys=False)


def context_sha256(public_context: bytes) -> str:
    return hashlib.sha256(bytes(public_context)).hexdigest()


def parse_context(data: bytes, *, secret: bool) -> "ts.Context":
    """Parse a serialized context; refuse the wrong kind of key material.

    ``secret=False`` refuses a context holding a secret key
    (:class:`SecretKeyNotAllowed`); ``secret=True`` requires one
    (:class:`InvalidKey`). Unparsable bytes raise :class:`MalformedPayload`;
    no public key :class:`ParameterMismatch`. The caller checks the scheme
    parameters.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError("context must be bytes")
    try:
        ctx = ts.context_from(bytes(data))
        has_secret, has_public = ctx.has_secret_key(), ctx.has_public_key()
    except Exception:  # TenSEAL/SEAL/protobuf raise assorted types with C++ text
        raise MalformedPayload("bytes do not parse as a TenSEAL context") from None
    if secret and not has_secret:
        raise InvalidKey("this operation needs the secret context; a public context cannot decrypt")
    if not secret and has_secret:
        raise SecretKeyNotAllowed(
            "the context holds a secret key; only the key holder may have it. Pass the public context "
            "(serialize_public) instead."
        )
    if not has_public:
        raise ParameterMismatch("context holds no public key")
    return ctx


def frame(magic: bytes, blobs: Sequence[bytes], length: int) -> bytes:
    parts = [BODY_HEAD.pack(magic, len(blobs), length)]
    for b in blobs:
        parts += [CHUNK_LEN.pack(len(b)), b]
    return b"".join(parts)


def split_body(body: bytes, magic: bytes, n_chunks: int, length: int, scheme: str) -> list:
    """The chunk blobs of a body that must hold ``n_chunks`` chunks for ``length`` values."""
    if len(body) < BODY_HEAD.size:
        raise MalformedPayload(f"{scheme} body truncated before its header ends")
    got_magic, count, total = BODY_HEAD.unpack_from(body)
    if got_magic != magic:
        raise MalformedPayload("not a body of this scheme (bad magic)")
    if total != length or count != n_chunks:
        raise MalformedPayload(f"{scheme} body holds {count} chunks for L={total}; expected "
                               f"{n_chunks} for L={length}")
    out, pos = [], BODY_HEAD.size
    for _ in range(count):
        if pos + CHUNK_LEN.size > len(body):
            raise MalformedPayload(f"{scheme} body truncated inside a chunk length")
        (n,) = CHUNK_LEN.unpack_from(body, pos)
        pos += CHUNK_LEN.size
        if n == 0 or n > MAX_CHUNK_BYTES or pos + n > len(body):
            raise MalformedPayload(f"{scheme} chunk length out of range or truncated")
        out.append(body[pos:pos + n])
        pos += n
    if pos != len(body):
        raise MalformedPayload(f"trailing bytes after the last {scheme} chunk")
    return out


def first_parms_id(ctx, scheme: str) -> list:
    try:
        return list(ctx.seal_context().data.first_parms_id())
    except Exception:
        raise ParameterMismatch(f"context has no {scheme} parameters") from None


def check_chunks(blobs: list, slots: int, length: int, parse: Callable, fresh: Callable,
                 sizes: Sequence[int] | None = None) -> list:
    """Parse every chunk blob and keep it only if ``fresh(vector, ciphertext)`` holds; all-or-nothing.

    Each chunk must hold ``sizes[i]`` values (default ``min(slots, what is left of length)``) in one
    ciphertext. Anything wrong raises a detail-free :class:`InvalidContribution`:
    the sender learns nothing about which check failed.
    """
    out = []
    for i, blob in enumerate(blobs):
        want = min(slots, length - i * slots) if sizes is None else sizes[i]
        try:
            vec = parse(blob)
            cts = vec.ciphertext()
            ok = vec.size() == want and len(cts) == 1 and fresh(cts[0])
        except Exception:
            raise InvalidContribution() from None
        if not ok:
            raise InvalidContribution()
        out.append(vec)
    return out


def add_chunks(acc: list | None, chunks: list) -> list:
    """acc += chunks, chunk by chunk (homomorphic addition)."""
    if acc is None:
        return list(chunks)
    if len(acc) != len(chunks):
        raise InvalidContribution()
    try:
        for a, c in zip(acc, chunks):
            a.add_(c)
    except Exception:
        raise InvalidContribution() from None
    return acc


def dump_chunks(magic: bytes, chunks: Sequence, length: int) -> bytes:
    return frame(magic, [c.serialize() for c in chunks], length)


def decrypt_chunks(chunks, length: int, dtype) -> "np.ndarray":
    """Decrypt and concatenate to a vector of ``length`` values of ``dtype``."""
    try:
        parts = [np.asarray(c.decrypt(), dtype=dtype) for c in chunks]
    except Exception:
        raise InvalidContribution() from None
    v = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
    if v.shape != (length,):
        raise InvalidContribution()
    return v
