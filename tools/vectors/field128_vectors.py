"""Known answers for Field128 (``p = 2^128 - 28 2^64 + 1``), computed in Python integers only.

    python -m secure_afl_tools.vectors field128            # rewrite vectors/field128.json
    python -m secure_afl_tools.vectors field128 --check    # exit 1 if regenerating changes a byte

Nothing here imports the library: every answer comes from the definitions (``%``, ``pow``, a naive DFT,
Horner, the ChaCha20 keystream read 16 bytes at a time), so the vectorised field in
:mod:`secure_afl.hazmat.field128` is checked against arithmetic that is easy to read. The inputs are edge
values (0, 1, p - 1, the words around 2^64, p's high word, (p-1)/2) and values drawn from SHAKE-256 of fixed
labels. Elements are written as hex strings (``"0x..."``), byte strings as plain hex.

Sections: the field's constants and the factors of p - 1; the primitive 2^k-th roots for a few k;
``arithmetic`` (a, b, a + b, a - b, a b); ``inverse``; ``powers``; ``ntt`` (a 16-point transform and its
inverse's input); ``poly_eval``; ``signed`` (z -> the 16-byte encoding of z mod p) and ``signed_refused``
(magnitudes past (p-1)/2); ``malformed`` (16-byte words that are no element); ``expand`` (elements from a
fixed key and domain).
"""

from __future__ import annotations

import hashlib
import json

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

__all__ = ["OWNS", "P", "build", "files", "expand_reference", "dft"]

#: the file of vectors/ this generator writes
OWNS = "field128.json"
P = 2 ** 128 - 28 * 2 ** 64 + 1
HALF = (P - 1) // 2
FACTORS = [(2, 66), (3, 1), (3491, 1), (440340496364689, 1)]
_LABEL = b"secure-afl field128 vectors v1 "


def _draw(label: str, count: int) -> list[int]:
    """``count`` values below p from SHAKE-256 of the label (17 bytes each, reduced: the bias is irrelevant
    for test inputs)."""
    raw = hashlib.shake_256(_LABEL + label.encode()).digest(17 * count)
    return [int.from_bytes(raw[17 * i:17 * i + 17], "little") % P for i in range(count)]


def _hex(x: int) -> str:
    return hex(x)


def root(n: int) -> int:
    return pow(7, (P - 1) // n, P)


def dft(a: list[int], w: int) -> list[int]:
    n = len(a)
    return [sum(a[j] * pow(w, i * j, P) for j in range(n)) % P for i in range(n)]


def expand_reference(key: bytes, n: int, domain: bytes) -> list[int]:
    """The ChaCha20 keystream (nonce: 4 zero bytes + domain), 16 bytes at a time, little-endian, kept if < p."""
    enc = Cipher(algorithms.ChaCha20(key, b"\x00" * 4 + domain), mode=None).encryptor()
    out = []
    while len(out) < n:
        x = int.from_bytes(enc.update(bytes(16)), "little")
        if x < P:
            out.append(x)
    return out


def build() -> dict:
    edge = [0, 1, 2, P - 1, P - 2, 2 ** 64 - 1, 2 ** 64, 2 ** 64 + 1, (2 ** 64 - 28) << 64, P - 2 ** 64,
            2 ** 127, HALF, HALF + 1, 28 * 2 ** 64 - 1, 2 ** 96, (2 ** 64 - 29) << 64 | (2 ** 64 - 1)]
    rand_a, rand_b = _draw("arithmetic a", 16), _draw("arithmetic b", 16)
    pairs = [(x, y) for x in edge[:8] for y in edge[:8]] + list(zip(edge, reversed(edge))) + \
        list(zip(rand_a, rand_b))
    ntt_in = _draw("ntt input", 16)
    coeffs, (x_eval,) = _draw("poly coefficients", 9), _draw("poly point", 1)
    key = hashlib.shake_256(_LABEL + b"expand key").digest(32)
    domain = hashlib.shake_256(_LABEL + b"expand domain").digest(12)
    signed = [0, 1, -1, 2 ** 63 - 1, -2 ** 63, 2 ** 64, -2 ** 64, HALF, -HALF, HALF - 1, -(HALF - 1)]
    px, pstart = _draw("powers base", 1)[0], 5
    return {
        "p": _hex(P), "half": _hex(HALF), "generator": 7, "two_adicity": 66,
        "p_minus_1_factors": [[q, e] for q, e in FACTORS],
        "roots_of_unity": [{"log_n": k, "root": _hex(root(1 << k))} for k in (0, 1, 2, 3, 4, 16, 20, 32, 65, 66)],
        "arithmetic": [{"a": _hex(a), "b": _hex(b), "sum": _hex((a + b) % P), "difference": _hex((a - b) % P),
                        "product": _hex(a * b % P)} for a, b in pairs],
        "inverse": [{"a": _hex(a), "inverse": _hex(pow(a, P - 2, P))} for a in edge[1:6] + rand_a[:6] if a],
        "powers": {"x": _hex(px), "start": pstart, "values": [_hex(pow(px, pstart + i, P)) for i in range(12)]},
        "ntt": {"input": [_hex(v) for v in ntt_in], "output": [_hex(v) for v in dft(ntt_in, root(16))]},
        "poly_eval": {"coeffs": [_hex(c) for c in coeffs], "x": _hex(x_eval),
                      "value": _hex(sum(c * pow(x_eval, e, P) for e, c in enumerate(coeffs)) % P)},
        "signed": [{"z": str(z), "encoded": (z % P).to_bytes(16, "little").hex()} for z in signed],
        "signed_refused": [str(HALF + 1), str(-HALF - 1), str(P), str(-(2 ** 127))],
        "malformed": [v.to_bytes(16, "little").hex() for v in (P, P + 1, 2 ** 128 - 1, ((2 ** 64 - 27) << 64))],
        "expand": {"key": key.hex(), "domain": domain.hex(), "n": 12,
                   "elements": [_hex(v) for v in expand_reference(key, 12, domain)]},
    }


def files(root=None) -> dict[str, str]:
    """``{path under vectors/: text}`` (nothing is recorded: every input is fixed)."""
    return {OWNS: json.dumps(build(), indent=1) + "\n"}
