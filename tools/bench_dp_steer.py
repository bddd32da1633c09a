"""``python -m secure_afl_tools.bench_dp_steer``: the aimed noise residual of split with DP and the Gram
statement, through the real roles, with and without the post-commitment permutation of the noise words.

One hospital of ``hospitals`` (a 10 % share by default) uploads zero statistics and puts, in its noise words,
the residual that hurts the release most of those it tries (the attacker knows the honest sums; every entry
inside the per-entry range and ``|z|^2 <= l2_z``, the largest residual the statement lets it keep:
:func:`secure_afl_tools.attacks_validity.attack_dp_q_residual`). Its upload is proven, sealed and released with
the honest hospitals' through :func:`secure_afl.split.run_split` (every role: the server's verifier messages
at the key holder's query seeds, the key holder's verdicts and share, the server's masked sum of the cohort,
the collector), which applies ``lanes - z + pi(z)`` on both verifiers' shares
(:mod:`secure_afl.split.noise_twist`). From the one release, exactly: the honest hospitals alone (the release
less the cheater's permuted lanes, which the cheater's query seed fixes) and the release the cheater aimed at
(the honest ones plus its lanes as uploaded, what the release was before the permutation). Prints, per draw
and over the draws, the accuracy change of the release against the honest hospitals alone, both ways.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

__all__ = ["steer_draw", "run_bench", "main"]


def steer_session(n: int, hospitals: int, field: str | None = None):
    from secure_afl import split
    from secure_afl.backends.session_params import dp_session_params
    from secure_afl.dp import DPSpec
    from secure_afl.packing import Layout
    from secure_afl.params import Bounds

    params = dp_session_params(DPSpec(1.0, 1e-5, 3), "split", "dp-steer", Layout(64, 10), 1.0,
                               Bounds(1.0, n, max(10, hospitals)), gram_proof=True,
                               **({} if field is None else {"field": field}))
    keys = split.generate_keys(params)
    return split.bind_public_context(params, keys.public_context), keys


def steer_draw(params, keys, rng, *, hospitals: int = 10, n: int = 1000, lam: float | None = None) -> dict:
    """One draw: ``{honest, released, aimed, verdict}`` (accuracies, and the cheater's verdict)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from secure_afl import split
    from secure_afl.stats import SufficientStatistics, local_statistics
    from secure_afl_tools.attacks_validity import digits_gaussian, field_decode, noisy_zero_upload, \
        release_accuracy, residual_words

    lay, gamma = params.layout, float(params.gamma)
    d, C = lay.dim, lay.n_classes
    circuit = split.Circuit(params)
    gs = circuit.part("gram")
    if lam is None:  # twice the honest shares' typical operator norm (attack_dp_q_residual's ridge)
        lam = 4.0 * np.sqrt(d) * split.sizes.dp_share_std(params) * np.sqrt(hospitals - 1)
    shares, (Xt, yt) = digits_gaussian(rng, hospitals - 1, n)
    stats = [local_statistics(X, yy, C, gamma=gamma) for X, yy in shares]
    honest = stats[0]
    for s in stats[1:]:
        honest = honest + s
    # the attacker's choice, in its own simulation on the honest sums: the direction that hurts most
    from secure_afl.analytic import solve_from_sums

    W_h = solve_from_sums(honest, lam=lam)
    dirs = [np.outer(Xt.mean(axis=0), np.eye(C)[c]) for c in range(C)] + \
        [-honest.cross, honest.gram @ W_h[:, np.roll(np.arange(C), 1)] - honest.cross]

    cross = np.arange(lay.slices["cross"].start, lay.slices["cross"].stop) - gs.i_noise[0]
    grid = 2.0 ** -int(params.backend_params["frac_bits"][0])

    def hurt(D):
        zq = residual_words(D, gs, int(cross[0]))[cross].reshape(d, C) * grid
        return release_accuracy(SufficientStatistics(honest.gram + gamma * np.eye(d), honest.cross + zq, honest.n,
                                              honest.class_counts, honest.contributors + 1, gamma), Xt, yt, lam)
    D = min(dirs, key=hurt)
    z = residual_words(D, gs, int(cross[0]))

    def decoded(noise):
        return field_decode(params, noisy_zero_upload(circuit, noise)[0])

    lanes, fw = noisy_zero_upload(circuit, z)
    body, seed, com = circuit.prove("cheater", lanes=lanes, factor=fw)
    key = Ed25519PrivateKey.generate()
    payload, st = split.seal_upload(params, body, seed, com, keys.public_context, "cheater", key)
    vectors = {f"h{k}": lay.pack(s) for k, s in enumerate(stats)}
    run = split.run_split(params, keys, vectors, uploads={"cheater": (payload, st)}, identities={"cheater": key})
    order, negate = split.noise_permutation(split.signed_query_seed(run.server_messages["cheater"], "cheater"), gs.n_z)
    pz = np.where(negate, -z[order], z[order])
    alone = run.vector - decoded(pz)  # exactly the honest hospitals' release: the cheater's lanes as summed
    return {"verdict": run.verdicts["cheater"],
            "honest": release_accuracy(lay.unpack(alone, gamma=gamma), Xt, yt, lam),
            "released": release_accuracy(lay.unpack(run.vector, gamma=gamma), Xt, yt, lam),
            "aimed": release_accuracy(lay.unpack(alone + decoded(z), gamma=gamma), Xt, yt, lam)}


def run_bench(*, draws: int = 10, hospitals: int = 10, n: int = 1000, seed: int = 0, field: str | None = None,
              verbose: bool = True) -> dict:
    params, keys = steer_session(n, hospitals, field)
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(draws):
        t = time.perf_counter()
        r = steer_draw(params, keys, rng, hospitals=hospitals, n=n)
        rows.append(r)
        if verbose:
            print(f"draw {i}: verdict {r['verdict'] or 'accepted'}; honest alone {r['honest']:.3f}, released "
                  f"{r['released']:.3f} ({100 * (r['released'] - r['honest']):+.1f} points), aimed without the "
                  f"permutation {r['aimed']:.3f} ({100 * (r['aimed'] - r['honest']):+.1f}) [{time.perf_counter() - t:.0f} s]")
    rel = np.array([r["released"] - r["honest"] for r in rows]) * 100
    aim = np.array([r["aimed"] - r["honest"] for r in rows]) * 100
    out = {"draws": rows, "released_mean": float(rel.mean()), "released_worst": float(rel.min()),
           "aimed_mean": float(aim.mean()), "aimed_worst": float(aim.min())}
    if verbose:
        print(f"{draws} draws, one cheater of {hospitals} hospitals (d = 64, C = 10, Gaussian fit of digits, "
              f"{params.backend_params['field']}): "
              f"accuracy change with the permutation {out['released_mean']:+.2f} points mean, "
              f"{out['released_worst']:+.2f} worst; aimed (without it) {out['aimed_mean']:+.2f} mean, "
              f"{out['aimed_worst']:+.2f} worst; honest alone {np.mean([r['honest'] for r in rows]):.3f}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=10)
    ap.add_argument("--hospitals", type=int, default=10)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--field", default=None, help="the session's field (default: split's default)")
    a = ap.parse_args(argv)
    run_bench(draws=a.draws, hospitals=a.hospitals, n=a.n, seed=a.seed, field=a.field)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
