"""What `session sign` accepts keeps every promise it prints, across the configuration space, not one example.

The sweep signs every roster size from 2 to 30 with every min_clients and every
colluder bound (the default and each explicit one), for every backend's
release rule, and checks the guarantees of the signed definition from the
functions the parties enforce (the release policy, the cohort rule, the
validity circuit), not from the printed text. The attack tests then drive the
real key holder at the smallest rosters, where the old default let a server and
min_clients - 1 colluders isolate one hospital.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from secure_afl.cohort import cohort_after_refusals, isolation_coalition, quorum, release_policy
from secure_afl.exceptions import InsufficientContributors, InvalidParameterError
from secure_afl.session.definition import guarantee_lines, normalise, split_soundness
from secure_afl.stats import local_statistics

pytestmark = pytest.mark.security


def _sections(n, mc, *, backend="plain", colluders=None, d=6, C=2, dp=False, gram=None, field=None, n_max=100,
              threshold=None):
    """A session's sections; ``gram`` and ``field`` (split only) are signed as given, None leaves the default."""
    s = {"session": {"id": "s-sweep", "backend": backend, "dim": d, "classes": C, "min_clients": mc,
                     "hospitals": [f"h{i:02d}" for i in range(n)]},
         "bounds": {"max_norm": 1.0, "n_max": n_max, "k_max": max(n, 8)}}
    if colluders is not None:
        s["session"]["colluders"] = colluders
    chosen = {k: v for k, v in (("gram_proof", gram), ("field", field)) if v is not None}
    if chosen:
        s["split"] = chosen
    if dp:
        s["dp"] = {"epsilon": 1.0, "delta": 1e-6}
    if threshold is not None:
        s["secagg"] = {"threshold": threshold}
    return s


def _sign(sections):
    try:
        return normalise(sections)
    except InvalidParameterError:
        return None


def _check_policy(definition):
    """The guarantees of a signed definition, from the policy the key holder and the server enforce."""
    policy = release_policy(definition)
    n, c, mc, q = len(policy.roster), policy.colluders, policy.min_clients, policy.quorum
    assert q <= n, "a signable session can release"
    assert q - c >= mc, "at least min_clients honest hospitals behind every release"
    assert 2 * (q - c) > n - c, "two cohorts of one session share an honest hospital"
    # the attack of a server with the colluders it needs below q: any cohort smaller than q is refused
    small = list(policy.roster[:q - 1])
    with pytest.raises(InsufficientContributors):
        cohort_after_refusals(policy, small, {})
    assert cohort_after_refusals(policy, list(policy.roster[:q]), {}) == list(policy.roster[:q])
    return policy


@pytest.mark.parametrize("backend", ["plain", "ckks", "bfv", "split"])
def test_every_signable_roster_keeps_its_quorum_promises(backend):
    # Execute: sign every (n, min_clients, colluders) a consortium of 2 to 30 hospitals can write
    signed = refused = 0
    for n in range(2, 31):
        for mc in range(1, n + 2):
            for c in [None, *range(0, mc + 2)]:
                d = _sign(_sections(n, mc, backend=backend, colluders=c))
                if d is None:
                    refused += 1
                    # refused only when no release could be formed: min_clients above the roster, or c's quorum
                    assert mc > n or quorum(n, c, mc) > n
                    continue
                signed += 1
                policy = _check_policy(d)
                if c is None:
                    # privacy before liveness: no larger c <= min_clients - 1 would still fit the roster
                    assert policy.colluders == mc - 1 or quorum(n, policy.colluders + 1, mc) > n
                    # so a server with min_clients - 1 colluders never isolates one hospital, unless the roster
                    # is min_clients itself (then every hospital but the victim colludes)
                    assert isolation_coalition(n, policy.colluders, mc) >= mc - 1 + policy.colluders
                    if n > mc:
                        assert isolation_coalition(n, policy.colluders, mc) > mc - 1
    assert signed > 3000 and refused > 1000  # both sides of the rule were exercised


def test_every_signable_secagg_threshold_keeps_its_quorum_promises():
    # Execute: sign every (n, min_clients, threshold) a consortium of 2 to 30 hospitals can write, the default
    # threshold included
    from secure_afl.cohort import default_colluders
    from secure_afl.secagg import consistency_quorum, recommended_neighbours

    signed = refused = 0
    for n in range(2, 31):
        m = (recommended_neighbours(n) or n - 1) + 1  # each hospital's share holders on the default graph
        can_sign = {mc: [t for t in range(2, m + 1) if consistency_quorum(n, t, mc) <= n] for mc in range(1, n + 2)}
        for mc in range(1, n + 2):
            for t in [None, *range(2, n + 1)]:
                d = _sign(_sections(n, mc, backend="secagg", threshold=t))
                if d is None:
                    refused += 1
                    # refused only when no release could be formed: the threshold's quorum (or every one's, for
                    # the default) above the roster, or more share holders than a hospital has
                    assert (t is None and not can_sign[mc]) or (t is not None and t not in can_sign[mc])
                    continue
                signed += 1
                policy = _check_policy(d)
                t_signed = d["secagg"]["threshold"]
                assert policy.colluders == t_signed - 1
                k = isolation_coalition(n, policy.colluders, mc, secagg_threshold=t_signed)
                others = isolation_coalition(n, default_colluders(n, mc), mc)
                # a session that isolates with fewer colluders than the other backends' default says so
                assert (f"fewer than the {others} " in dict(guarantee_lines(d))["isolation"]) == (k < others)
                if t is None:
                    # privacy first, as the others: their isolation, or the most any signable threshold gives
                    best = max(isolation_coalition(n, x - 1, mc, secagg_threshold=x) for x in can_sign[mc])
                    assert k >= others or k == best, (n, mc, t_signed, k, others, best)
    assert signed > 3000 and refused > 1000  # both sides of the rule were exercised


def test_the_printed_lines_carry_the_enforced_numbers():
    # Prepare: a small consortium at the default min_clients (3), where the old default signed c = 0
    d = normalise(_sections(4, 3))
    policy = release_policy(d)
    lines = dict(guarantee_lines(d))
    # Assert: what is printed is what the policy enforces
    assert f"q = {policy.quorum} of the 4 hospitals" in lines["isolation"]
    assert f"the server and {policy.quorum - 1} colluding hospitals" in lines["isolation"]
    assert f"{4 - policy.quorum} of 4 hospitals may drop out" in lines["quorum"]
    assert policy.quorum == 4 and policy.colluders == 1


@pytest.mark.parametrize("n, mc", [(1, 2), (2, 3), (3, 5)])
def test_a_roster_too_small_for_min_clients_is_refused_naming_the_smallest_that_works(n, mc):
    with pytest.raises(InvalidParameterError, match=f"smallest roster that works has {mc} hospitals"):
        normalise(_sections(n, mc))


# -- soundness ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("d, C", list(itertools.product([6, 64, 512], [2, 10, 100])))
def test_every_signable_split_session_reaches_64_bits(d, C):
    for dp, gram, field in itertools.product([False, True], [None, False, True], [None, "goldilocks", "field128"]):
        # what sign refuses is asserted on too: never for the soundness floor (the verifier adds repetitions
        # until the circuit reaches it), only for a named sizing reason with what to change (None: the default)
        try:
            defn = normalise(_sections(6, 3, backend="split", d=d, C=C, dp=dp, gram=gram, field=field, n_max=1000))
        except InvalidParameterError as e:
            assert "soundness" not in str(e) and "lower" in str(e), (d, C, dp, gram, field, str(e))
            continue
        bits, reps = split_soundness(defn.session_params())
        assert bits >= 64, (d, C, dp, gram, field, bits, reps)
        assert f"2^-{bits:.1f}" in dict(guarantee_lines(defn))["soundness"]


def test_the_dp_gram_session_at_d512_reaches_64_bits_with_a_fourth_repetition():
    # Prepare: the session a review found at 2^-61.6 with three repetitions (the noise share's range bits, in
    # Goldilocks; over Field128, the default, rows replace them and three repetitions reach the floor)
    from secure_afl.split.proof import Circuit, soundness_bits

    defn = normalise(_sections(6, 3, backend="split", d=512, C=100, dp=True, gram=True, field="goldilocks",
                               n_max=1000))
    circuit = Circuit(defn.session_params())
    # Assert: the circuit the parties build takes more repetitions and so reaches the floor
    assert circuit.reps > 3 and soundness_bits(circuit) >= 64
    circuit.reps = 3
    assert soundness_bits(circuit) < 64


def test_a_split_session_below_the_floor_is_refused_naming_what_to_change(monkeypatch):
    # Prepare: a verifier that may not add repetitions (as a regression to a fixed count would be)
    import secure_afl.split.proof as proof

    monkeypatch.setattr(proof, "MAX_REPS", 3)
    # Execute / Assert: sign refuses the DP + Gram session at d = 512 by name
    with pytest.raises(InvalidParameterError, match="validity soundness 2\\^-6[0-3].*lower n_max"):
        normalise(_sections(6, 3, backend="split", d=512, C=100, dp=True, gram=True, field="goldilocks",
                            n_max=1000))


def test_extra_repetitions_prove_and_verify_as_three_do(monkeypatch):
    # Prepare: a small session whose circuit is made to take more repetitions than three
    import secure_afl.split.proof as proof

    monkeypatch.setattr(proof, "SOUNDNESS_BITS", 90)
    # Goldilocks without the statement: the flipped auxiliary word below is one uint64
    params = normalise(_sections(4, 3, backend="split", d=4, C=2, gram=False, field="goldilocks")).session_params()
    circuit = proof.Circuit(params)
    assert circuit.reps > 3
    rng = np.random.default_rng(1)
    X = rng.normal(size=(10, 4))
    X /= np.linalg.norm(X, axis=1, keepdims=True) * 1.5
    vec = params.layout.pack(local_statistics(X, rng.integers(0, 2, 10), 2, gamma=params.gamma))
    body, seed, com = circuit.prove("h00", vec)
    leader, helper = circuit.leader_share(body), circuit.helper_share(seed)
    qs = bytes(32)
    msgs = [circuit.query(s, com, "h00", qs, leader=lead) for s, lead in ((leader, True), (helper, False))]
    # Assert: an honest upload is valid, and a flipped auxiliary bit is caught by the extra repetitions too
    assert circuit.decide(*msgs) is None
    bad, bseed, bcom = circuit.prove("h00", vec, check=False,
                                     aux_override=lambda c, x, fs: _flip(c._aux(x, fs, check=False)))
    bl, bh = circuit.leader_share(bad), circuit.helper_share(bseed)
    verdict = circuit.decide(circuit.query(bl, bcom, "h00", qs, leader=True),
                             circuit.query(bh, bcom, "h00", qs, leader=False))
    assert verdict is not None


def _flip(aux):
    out = np.array(aux, dtype=np.uint64)
    out[0] = np.uint64(2)  # not a bit
    return out
