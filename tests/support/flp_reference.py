"""A slow, independent Python-integer reference for the Goldilocks field and the bit proof.

Written from the definitions (naive DFT, naive polynomial products), sharing no
code with secure_afl.hazmat.flp, so the vectorised implementation is checked
against arithmetic that is easy to read.
"""

from __future__ import annotations

P = 2 ** 64 - 2 ** 32 + 1


def root(n: int) -> int:
    return pow(7, (P - 1) // n, P)


def dft(a: list[int], w: int) -> list[int]:
    n = len(a)
    return [sum(a[j] * pow(w, i * j, P) for j in range(n)) % P for i in range(n)]


def idft(a: list[int]) -> list[int]:
    n = len(a)
    ninv = pow(n, P - 2, P)
    return [v * ninv % P for v in dft(a, pow(root(n), P - 2, P))]


def polymul(a: list[int], b: list[int]) -> list[int]:
    out = [0] * (len(a) + len(b) - 1)
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            out[i + j] = (out[i + j] + x * y) % P
    return out


def polyeval(c: list[int], x: int) -> int:
    return sum(v * pow(x, e, P) for e, v in enumerate(c)) % P


def bit_proof(bits: list[int], r: int, seeds: list[int], chunk: int) -> list[int]:
    """Seeds ++ coefficients of P = sum_j U_j V_j (degree <= 2N - 2), as the module docstring defines them."""
    m = len(bits)
    calls = -(-m // chunk)
    n = 2
    while n <= calls:
        n *= 2
    padded = bits + [0] * (calls * chunk - m)
    total = [0] * (2 * n - 1)
    for j in range(chunk):
        u = [seeds[j]] + [pow(r, k * chunk + j + 1, P) * padded[k * chunk + j] % P for k in range(calls)]
        v = [seeds[chunk + j]] + [(padded[k * chunk + j] - 1) % P for k in range(calls)]
        u += [0] * (n - len(u))
        v += [0] * (n - len(v))
        prod = polymul(idft(u), idft(v))
        total = [(a + b) % P for a, b in zip(total, prod)]
    return list(seeds) + total


def projection(hi: list[int], fs: bytes, rows: int) -> list[int]:
    """``<r_j, hi> mod p`` for the validity circuit's rows (:func:`ternary_rows` under its row key and domain)."""
    import hashlib

    return ternary_rows(hi, hashlib.sha256(fs + b"rows\0").digest(), b"saflVALIDrow", rows, P)


def ternary_rows(words: list[int], key: bytes, domain: bytes, rows: int, p: int) -> list[int]:
    """The first ``rows`` projections mod ``p`` from the definition, trit by trit: row j is the next
    ceil(n / 4) bytes of the ChaCha20 stream, byte b holding entries 4b..4b+3, two bits each (low: nonzero,
    high: sign)."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    enc = Cipher(algorithms.ChaCha20(key, b"\x00" * 4 + domain), mode=None).encryptor()
    row_bytes = -(-len(words) // 4)
    out = []
    for _ in range(rows):
        stream = enc.update(bytes(row_bytes))
        acc = 0
        for i, x in enumerate(words):
            pair = (stream[i // 4] >> (2 * (i % 4))) & 3
            if pair & 1:
                acc += -x if pair & 2 else x
        out.append(acc % p)
    return out


def square_sum_proof(v: list[int], length: int, groups: int, seeds: list[int], chunk: int) -> list[int]:
    """Seeds ++ coefficients of P = sum_j U_j^2 for the square-sum proof (hazmat/flp_square.py's docstring):
    group g's entries in calls g * ceil(length / c) ..., wire j of call k at a^(k+1), seed j at a^0."""
    per = -(-length // chunk)
    calls = groups * per
    n = 2
    while n <= calls:
        n *= 2
    wires = []
    for g in range(groups):
        row = v[g * length:(g + 1) * length] + [0] * (per * chunk - length)
        wires += [row[k * chunk:(k + 1) * chunk] for k in range(per)]
    total = [0] * (2 * n - 1)
    for j in range(chunk):
        u = [seeds[j]] + [wires[k][j] for k in range(calls)]
        u += [0] * (n - len(u))
        c = idft(u)
        total = [(a + b) % P for a, b in zip(total, polymul(c, c))]
    return list(seeds) + total
