"""Secrets at rest: the one sealed format of the project (a key holder's secret keys, a hospital's SecAgg state).

``SAFLSK01 | kdf | log2 n | r | p | salt[16] | nonce[12] | AES-256-GCM(ct||tag)``,
the key either 32 random bytes (``key=``, kdf 0) or scrypt(passphrase) with
n = 2^log2n, r = 8, p = 1 (kdf 1). The header and the caller's associated data
(what the secret belongs to: session, party, run) are authenticated, so a
sealed file moved to another session or party does not open. A wrong key,
passphrase or associated data raises :class:`~secure_afl.exceptions.InvalidKey`;
a file that is not one of these raises
:class:`~secure_afl.exceptions.MalformedPayload`.
"""

from __future__ import annotations

import os
import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from .. import domains
from ..exceptions import InvalidKey, MalformedPayload

__all__ = ["seal_secret", "open_secret"]

_SK_MAGIC = domains.SECRET_KEY_MAGIC
_SK_HEAD = struct.Struct("<8sBBBB16s12s")  # magic, kdf, log2 n, r, p, salt, nonce
_KDF_RAW, _KDF_SCRYPT = 0, 1
_SCRYPT_LOG2N_RANGE = (14, 22)


def _derive(kdf: int, log2n: int, r: int, p: int, salt: bytes, passphrase, key) -> bytes:
    if kdf == _KDF_RAW:
        if key is None:
            raise InvalidKey("this secret was sealed with a key; pass key=")
        if not isinstance(key, (bytes, bytearray)) or len(key) != 32:
            raise ValueError("key must be 32 bytes")
        return bytes(key)
    if passphrase is None:
        raise InvalidKey("this secret was sealed with a passphrase; pass passphrase=")
    pw = passphrase.encode() if isinstance(passphrase, str) else passphrase
    if not isinstance(pw, (bytes, bytearray)) or len(pw) == 0:
        raise ValueError("passphrase must be a non-empty str or bytes")
    return Scrypt(salt=salt, length=32, n=1 << log2n, r=r, p=p).derive(bytes(pw))


def seal_secret(secret: bytes, *, associated_data: bytes, passphrase=None, key: bytes | None = None,
                scrypt_log2_n: int = 17) -> bytes:
    """AES-256-GCM encrypt ``secret``; the key is ``key`` (32 bytes) or scrypt(passphrase).

    Format: ``SAFLSK01 | kdf | log2 n | r | p | salt[16] | nonce[12] | ct||tag``.
    The header and ``associated_data`` (what the secret belongs to) are authenticated.
    """
    if (passphrase is None) == (key is None):
        raise ValueError("pass exactly one of passphrase= or key=")
    lo, hi = _SCRYPT_LOG2N_RANGE
    if not lo <= scrypt_log2_n <= hi:
        raise ValueError(f"scrypt_log2_n must be in [{lo}, {hi}]")
    kdf = _KDF_RAW if key is not None else _KDF_SCRYPT
    salt = os.urandom(16) if kdf == _KDF_SCRYPT else bytes(16)
    head = _SK_HEAD.pack(_SK_MAGIC, kdf, scrypt_log2_n if kdf else 0, 8 if kdf else 0, 1 if kdf else 0,
                         salt, os.urandom(12))
    k = _derive(kdf, scrypt_log2_n, 8, 1, salt, passphrase, key)
    return head + AESGCM(k).encrypt(head[-12:], bytes(secret), head + bytes(associated_data))


def open_secret(blob: bytes, *, associated_data: bytes, passphrase=None, key: bytes | None = None) -> bytes:
    """Inverse of :func:`seal_secret`. Wrong passphrase/key/associated data -> :class:`InvalidKey`."""
    blob = bytes(blob)
    if len(blob) < _SK_HEAD.size + 16:
        raise MalformedPayload("sealed secret truncated")
    magic, kdf, log2n, r, p, salt, nonce = _SK_HEAD.unpack_from(blob)
    if magic != _SK_MAGIC or kdf not in (_KDF_RAW, _KDF_SCRYPT):
        raise MalformedPayload("not a sealed secret")
    lo, hi = _SCRYPT_LOG2N_RANGE
    if kdf == _KDF_SCRYPT and not (lo <= log2n <= hi and r == 8 and p == 1):
        raise MalformedPayload("sealed secret has unsupported scrypt parameters")
    k = _derive(kdf, log2n, r, p, salt, passphrase, key)
    head = blob[:_SK_HEAD.size]
    try:
        return AESGCM(k).decrypt(nonce, blob[_SK_HEAD.size:], head + bytes(associated_data))
    except InvalidTag:
        raise InvalidKey("the sealed secret could not be unlocked") from None
