"""``secure-afl bench field``: Field128 against the Goldilocks field, numpy and compiled, in one run.

    secure-afl bench field [--log-n 20] [--ntt 16 20] [--repeats 3] [--json PATH]
    python -m secure_afl_tools.bench_field            # the same

For ``n = 2^log_n`` random elements of each field, the best of ``repeats`` wall-clock times of: ``mul``,
``add`` (elementwise), ``dot`` (sum of products), ``ntt`` at each size from ``2^16`` to ``2^20`` by default,
and ``expand`` (n elements from a ChaCha20 key). Four columns:

* ``gold numpy``: :mod:`secure_afl.hazmat.flp` as a hospital runs it (numpy);
* ``gold compiled``: the same with its compiled product loaded (as a verifier's worker runs it: products,
  hence dot and the NTT's butterflies; its add and expansion stay numpy);
* ``f128 numpy``: :data:`secure_afl.hazmat.field128.FIELD128` on its numpy words;
* ``f128 numba``: the same with :mod:`secure_afl.hazmat.field128_kernels` loaded.

and the ratios that matter: Field128 numpy and numba over Goldilocks numpy, Field128 numba over Goldilocks
compiled, and what the compiled loops gain over Field128's numpy path. The compile (or cache load) is done
before the clock starts. Figures on a shared machine move with its load: compare ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np

__all__ = ["register", "run", "main"]

COLUMNS = ("gold numpy", "gold compiled", "f128 numpy", "f128 numba")


def _best(fn, repeats: int) -> float:
    fn()  # first call: numba's dispatch, the twiddle and bit-reversal caches
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def run(log_n: int = 20, ntt_range: tuple[int, int] = (16, 20), repeats: int = 3, seed: int = 0) -> dict:
    from secure_afl.hazmat import field128_kernels, flp, ternary
    from secure_afl.hazmat.field128 import FIELD128 as F

    rng = np.random.default_rng(seed)
    n = 1 << log_n
    big = max(n, 1 << ntt_range[1])
    g_a, g_b = (flp.expand_field(rng.bytes(32), big, bytes(12)) for _ in range(2))
    f_a, f_b = (F.expand_field(rng.bytes(32), big, bytes(12)) for _ in range(2))
    key = rng.bytes(32)
    cases = {
        "mul": (lambda: flp.mul(g_a[:n], g_b[:n]), lambda: F.mul(f_a[:n], f_b[:n])),
        "add": (lambda: flp.add(g_a[:n], g_b[:n]), lambda: F.add(f_a[:n], f_b[:n])),
        "dot": (lambda: flp.dot(g_a[:n], g_b[:n]), lambda: F.dot(f_a[:n], f_b[:n])),
    }
    for k in range(ntt_range[0], ntt_range[1] + 1):
        cases[f"ntt 2^{k}"] = (lambda k=k: flp.ntt(g_a[:1 << k]), lambda k=k: F.ntt(f_a[:1 << k]))
    cases["expand"] = (lambda: flp.expand_field(key, n, bytes(12)), lambda: F.expand_field(key, n, bytes(12)))

    gold_product = ternary.product_kernel() if ternary.AVAILABLE else None
    compiled = field128_kernels.load()
    saved = flp._compiled_mul  # the switch ternary flips when a verifier loads its kernels
    rows = {}
    try:
        for name, (gold, f128) in cases.items():
            row = {}
            flp._compiled_mul = None
            row["gold numpy"] = _best(gold, repeats)
            if gold_product is not None:
                flp._compiled_mul = gold_product
                row["gold compiled"] = _best(gold, repeats)
            field128_kernels.unload()
            row["f128 numpy"] = _best(f128, repeats)
            if compiled is not None:
                field128_kernels.load()
                row["f128 numba"] = _best(f128, repeats)
                field128_kernels.unload()
            rows[name] = row
    finally:
        flp._compiled_mul = saved
    return {"n": n, "repeats": repeats, "machine": platform.machine(), "cpus": os.cpu_count(),
            "numba": compiled is not None, "seconds": rows}


def _ratio(row: dict, num: str, den: str) -> str:
    return f"{row[num] / row[den]:.2f}x" if num in row and den in row else "-"


def render(res: dict) -> str:
    lines = [f"Field128 vs Goldilocks, n = 2^{res['n'].bit_length() - 1} (ntt: the size named), best of "
             f"{res['repeats']}, {res['cpus']} CPUs; seconds, then ratios",
             f"{'case':<10}" + "".join(f"{c:>14}" for c in COLUMNS) +
             f"{'f128np/gold':>13}{'f128nb/gold':>13}{'f128nb/goldc':>14}{'numba gain':>12}"]
    for name, row in res["seconds"].items():
        cells = "".join(f"{row[c]:>14.4f}" if c in row else f"{'-':>14}" for c in COLUMNS)
        lines.append(f"{name:<10}{cells}{_ratio(row, 'f128 numpy', 'gold numpy'):>13}"
                     f"{_ratio(row, 'f128 numba', 'gold numpy'):>13}{_ratio(row, 'f128 numba', 'gold compiled'):>14}"
                     f"{_ratio(row, 'f128 numpy', 'f128 numba'):>12}")
    return "\n".join(lines)


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-n", type=int, default=20, help="elements per elementwise case: 2^N (default 20)")
    parser.add_argument("--ntt", type=int, nargs=2, default=[16, 20], metavar=("LO", "HI"),
                        help="NTT sizes 2^LO .. 2^HI (default 16 20)")
    parser.add_argument("--repeats", type=int, default=3, help="keep the fastest of R runs (default 3)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON here")
    parser.set_defaults(func=_cmd)


def _cmd(args) -> int:
    if not 1 <= args.log_n <= 24 or not 1 <= args.ntt[0] <= args.ntt[1] <= 24 or args.repeats < 1:
        raise SystemExit("bench field: sizes 2^1 .. 2^24 and at least one repeat")
    res = run(args.log_n, tuple(args.ntt), args.repeats)
    print(render(res))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m secure_afl_tools.bench_field", description=__doc__.splitlines()[0])
    register(ap)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
