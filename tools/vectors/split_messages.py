"""Message-level vectors for ``split``: one upload and the messages around it, for fixed keys and randomness.

    python -m secure_afl_tools.vectors split            # rewrite vectors/split/
    python -m secure_afl_tools.vectors split --check    # exit 1 if regenerating changes a byte

One file per instance (a session's parameterisation), vectors/split/<instance>.json, and one per bad case,
vectors/split/bad_<case>.json (the layout: :mod:`secure_afl_tools.vectors.files`). An instance holds the
session's parameters, the keys (as the seeds they are derived from), the hospital's packed vector and proving
randomness, the honest upload's sealed payload with the validity commitment, the seed box and the signed seed
statement, the key holder's query seed, the server's signed verifier message and the key holder's own. Each
bad case is replayed against both verifiers (tests/test_split_vectors.py); ``plain``'s are:

* ``count_minus_one``: a class count of -1, the next count raised so that they still sum to n, the bits
  claiming 0 (every other relation holds): both messages formed, the joint check refuses it (``linear``);
* ``tampered_proof``: the honest body with one bit-proof word changed (the commitment does not cover the
  proofs): ``bits``;
* ``seed_misses_commitment``: the honest upload judged with another seed: the key holder refuses it
  (``commitment``) before any query;
* ``message_for_another_payload``: the server's signed message for the honest upload presented for the
  count_minus_one payload: the key holder refuses it (``InvalidSignature``).

``plain`` also holds ``release``, the honest upload's release: the key holder's share and signed share
statement over a manifest naming it alone, the server's masked sum over that statement's cohort with its
signed statement (``split-sum``), and the decoded sum.

Two more instances, each with its own session, upload, seed box, statement and cases:

* ``gram``: the same layout with ``[split] gram_proof`` at the fewest fractional bits the factor allows
  (f1 = 24): the honest upload (its statistics snapped onto 2^t L L^T), then an indefinite upload,
  counts (4, 4) and C = diag(16, -9), proven with the factor over the field (L L^T = A holds mod p; its
  range rows refuse it: ``gram_range``) and with the honest upload's factor as a stand-in (in range; the
  quadratic identity refuses it: ``gram``);
* ``dp_gram``: DP and the Gram statement together (the noise share travels as its own words): the honest
  upload with a fixed share, and a cheater whose statistics before noise are a Gram matrix (gamma I and
  the counts) and whose noise words carry diag(+T_z, -T_z), one grid step beyond their proven range:
  ``noise``; and one whose noise words carry the cross terms Q at +-(T_z - 1), every entry in range but the
  share's squared l2 norm beyond its bound: ``noise``;
* ``dp_gram_field128``: the same over Field128, the default (the share's range by projection rows of its own
  and by groups of its l2 bound): the honest upload, noise words at +-(2 T_z + 1) (past the rows: ``noise``),
  and the cross terms at +-(2^z_log2 - 1), the per-entry bound the groups give, past the l2 bound: ``noise``.

HPKE encapsulation is randomised and ``cryptography`` offers no deterministic path, so the seed box is
recorded: regenerating keeps the box in the tree's file while it opens under the fixed key and the upload's
associated data to the fixed seed (else seals a new one). ``dp_gram``'s noise share is recorded the same way
(numpy may change its seeded stream), kept while the instance's session parameters are the recorded ones.
Everything else (Ed25519 signatures, the proof's randomness) is deterministic.
"""

from __future__ import annotations

import hashlib

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.mlkem import MLKEM768PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from secure_afl.exceptions import InvalidInputError
from secure_afl.split.sizes import GRAM_MIN_F
from secure_afl_tools.vectors import files as vector_files

__all__ = ["OWNS", "VERSION", "INSTANCES", "build", "fixed_keys", "files"]

#: the folder of vectors/ this generator writes, every file in it
OWNS = "split"
#: the instances, each a file of its own
INSTANCES = ("plain", "gram", "dp_gram", "dp_gram_field128")
HOSPITAL = "h1"
#: the files' format (why it is 2: files.VERSIONS); a file of another version is refused by name
VERSION = vector_files.VERSIONS[OWNS]
#: the inputs every key and random byte is derived from (SHAKE-256 of the label)
_LABEL = b"secure-afl split message vectors v1 "


def _bytes(label: str, n: int) -> bytes:
    return hashlib.shake_256(_LABEL + label.encode()).digest(n)


def fixed_keys():
    """``(key holder seed key pair, hospital, server and key holder Ed25519 keys)`` from fixed labels."""
    from secure_afl.split import SplitKeyPair

    mk = MLKEM768PrivateKey.from_seed_bytes(_bytes("keyholder ml-kem seed", 64))
    xk = X25519PrivateKey.from_private_bytes(_bytes("keyholder x25519", 32))
    pair = SplitKeyPair(mk.private_bytes_raw() + xk.private_bytes_raw(),
                        mk.public_key().public_bytes_raw() + xk.public_key().public_bytes_raw())
    ed = {who: Ed25519PrivateKey.from_private_bytes(_bytes(f"{who} ed25519", 32))
          for who in ("hospital", "server", "keyholder")}
    return pair, ed


def _session(pair):
    from secure_afl import split
    from secure_afl.packing import Layout
    from secure_afl.params import Bounds

    # a coarse fixed point (f1 = 4) keeps the projection's bit widths, and so the file, small
    params = split.split_session_params("split-vectors", Layout(2, 2), 1.0, Bounds(2.0, 8, 4), frac_bits=(4, 8),
                                        field="goldilocks", gram_proof=False)
    return split.bind_public_context(params, pair.public_context)


def _vector(params) -> np.ndarray:
    """Five rows of dyadic entries (exact in float64 whatever the BLAS), two classes."""
    from secure_afl.stats import local_statistics

    X = np.array([[1.0, 0.5], [0.25, -1.0], [-0.5, 0.75], [1.25, 0.0], [0.0, -0.5]])
    y = np.array([0, 1, 0, 1, 1])
    return params.layout.pack(local_statistics(X, y, params.layout.n_classes, gamma=params.gamma))


def _prove(circuit, x, fw, label: str, **kw):
    """The first proving try, over labelled randomness, that the projection does not refuse."""
    from secure_afl.split import Unlucky

    for i in range(16):
        rand = _bytes(f"{label} rand {i}", circuit.rand_size)
        try:
            return rand, circuit.prove_once(HOSPITAL, x, fw, rand, **kw)
        except Unlucky:
            continue
    raise RuntimeError("16 labelled tries were all unlucky")  # pragma: no cover - probability 2^-256


def _count_minus_one(circuit, x):
    """Lanes with count 0 at -1 and count 1 raised to keep the sum, and the bits that keep every other
    relation: the counts claimed 0 and c1 + c0 (in range)."""
    from secure_afl.hazmat import flp

    hi = [int(v) for v in flp.decode_signed(x[:circuit.L])]
    scale = 1 << circuit.f1
    i0, i1 = int(circuit.i_counts[0]), int(circuit.i_counts[1])
    c0, c1 = hi[i0] // scale, hi[i1] // scale
    hi[i0], hi[i1] = -scale, (c1 + c0 + 1) * scale
    bad = x.copy()
    bad[:circuit.L] = flp.encode_signed(np.array(hi, dtype=np.int64))

    def aux(c, lanes, fs):
        vals = c.witness_values(lanes, fs, check=False)
        vals["counts"][0], vals["counts"][1] = 0, c0 + c1
        return c.bits_from(vals)

    return bad, aux


def _case(circuit, name: str, expect: str | None, payload: bytes, validity: dict, seed: bytes, qs: bytes, server_key,
          mutation: str | None = None, server_message: dict | None = None) -> dict:
    """One replay: the server's signed message (formed here unless given), the key holder's check of it and
    its verdict, as recorded; an exception is recorded by its class name. ``expect``: the verdict or exception
    the case is for (None: valid); a case that meets another is a generator bug, refused here rather than
    written."""
    from secure_afl import split
    from secure_afl.exceptions import SecureAFLError
    from secure_afl.hazmat import flp

    sha = hashlib.sha256(payload).hexdigest()
    out = {"name": name, "expect": expect, "payload": payload.hex(), "payload_sha256": sha, "validity": validity,
           "seed": seed.hex(), "query_seed": qs.hex()}
    if mutation is not None:
        out["mutation"] = mutation
    if server_message is None:
        server_message = split.leader_message(circuit, HOSPITAL, payload, {"validity": validity}, server_key, qs)
    out["server_message"] = server_message
    try:
        _, leader = split.verify_leader_message(server_message, server_key.public_key(), circuit, HOSPITAL, sha, qs)
        verdict, own = split.helper_verdict(circuit, HOSPITAL, seed, {"validity": validity}, qs, leader,
                                            with_message=True)
        out["keyholder"] = {"verdict": verdict, "message": None if own is None else circuit.F.to_bytes(own).hex()}
        got = verdict
    except SecureAFLError as e:
        out["keyholder"] = {"exception": type(e).__name__}
        got = type(e).__name__
    if got != expect:  # pragma: no cover - a generator change that breaks a case
        raise RuntimeError(f"the {name} case meets {got!r}, not the {expect!r} it is for")
    return out


def _instance(name: str, description: str, pair, ed, fields: dict, honest: dict, bad: list[dict]) -> dict:
    """``{file name: content}``: the instance (its keys, parameters, honest case and the names of its bad
    cases in order) and one file per bad case, naming the instance it mutates."""
    head = {"version": VERSION, "protocol": OWNS}
    inst = {**head, "instance": name, "description": description + " " + _RECORDED, "hospital": HOSPITAL,
            "keys": _keys(pair, ed), **fields, "honest": honest, "bad_cases": [c["name"] for c in bad]}
    return {name: inst, **{f"{vector_files.BAD}{c['name']}": {**head, "instance": name, **c} for c in bad}}


_RECORDED = ("Generated by `python -m secure_afl_tools.vectors split`. HPKE encapsulation is randomised (cryptography "
             "has no deterministic path): the seed box is recorded and must open under the fixed key to the seed; a "
             "DP instance's noise share is recorded too; every other field is deterministic and regenerated byte "
             "for byte.")


def _keys(pair, ed) -> dict:
    return {"derivation": "SHAKE-256(\"" + _LABEL.decode() + "\" || label)",
            "keyholder_secret_key": pair.secret_context.hex(),
            "keyholder_public_key_sha256": hashlib.sha256(pair.public_context).hexdigest(),
            "hospital_ed25519": ed["hospital"].private_bytes_raw().hex(),
            "server_ed25519": ed["server"].private_bytes_raw().hex(),
            "keyholder_ed25519": ed["keyholder"].private_bytes_raw().hex()}


def build(recorded: dict[str, dict] | None = None) -> dict[str, dict]:
    """The files by name (the instances and their bad cases); ``recorded``: the instances as they stand, by
    name, whose seed boxes (and DP noise share) are kept while they still hold."""
    recorded = recorded or {}
    pair, ed = fixed_keys()
    out: dict[str, dict] = {}
    for make in (_plain, _gram, _dp_gram, _dp_gram_field128):
        out.update(make(pair, ed, recorded))
    return out


def _plain(pair, ed, recorded: dict[str, dict]) -> dict[str, dict]:
    from secure_afl import split
    from secure_afl.envelope import seal
    from secure_afl.hazmat import flp

    params = _session(pair)
    circuit = split.Circuit(params)
    v = _vector(params)
    x, fw = circuit.witness(v)
    rand, (body, seed, com) = _prove(circuit, x, fw, "honest")
    payload = seal(params, "contribution", flp.to_bytes(body))
    sha = hashlib.sha256(payload).hexdigest()
    upload = _upload(params, pair, ed, sha, seed, com, recorded.get("plain"))
    qs = split.query_seed(split.query_key(pair.secret_context), params, HOSPITAL, sha, com.to_dict())
    server = ed["server"]
    honest = _case(circuit, "honest", None, payload, com.to_dict(), seed, qs, server)

    bad_lanes, aux = _count_minus_one(circuit, x)
    _, (b_body, b_seed, b_com) = _prove(circuit, bad_lanes, fw, "count_minus_one", check=False, aux_override=aux)
    b_payload = seal(params, "contribution", flp.to_bytes(b_body))
    b_sha = hashlib.sha256(b_payload).hexdigest()
    b_qs = split.query_seed(split.query_key(pair.secret_context), params, HOSPITAL, b_sha, b_com.to_dict())

    t_body = body.copy()
    off = circuit.commit_len + circuit.n_bits
    t_body[off] = flp.add(t_body[off:off + 1], np.uint64(1))[0]
    t_payload = seal(params, "contribution", flp.to_bytes(t_body))
    t_qs = split.query_seed(split.query_key(pair.secret_context), params, HOSPITAL,
                            hashlib.sha256(t_payload).hexdigest(), com.to_dict())
    other_seed = bytes([seed[0] ^ 1]) + seed[1:]

    bad = [
        _case(circuit, "count_minus_one", "linear", b_payload, b_com.to_dict(), b_seed, b_qs, server,
              "a class count of -1, every other relation kept"),
        _case(circuit, "tampered_proof", "bits", t_payload, com.to_dict(), seed, t_qs, server,
              "one bit-proof word of the honest body changed"),
        _case(circuit, "seed_misses_commitment", "commitment", payload, com.to_dict(), other_seed, qs, server,
              "the honest upload judged with a seed it does not commit to"),
        _case(circuit, "message_for_another_payload", "InvalidSignature", b_payload, b_com.to_dict(), b_seed, b_qs,
              server, "the server's signed message for the honest upload, presented for the count_minus_one upload",
              server_message=honest["server_message"]),
    ]
    fields = {"params": params.to_dict(), "vector": [float(f) for f in v], "rand": rand.hex(), "upload": upload,
              "release": _release(params, pair, ed, payload, upload)}
    return _instance("plain", "split, the plain statement: one honest upload, the messages around it and its "
                     "release alone, for fixed keys and randomness.", pair, ed, fields, honest, bad)


def _release(params, pair, ed, payload: bytes, upload: dict) -> dict:
    """The release of the honest upload alone: the manifest, the key holder's share and signed share statement,
    the server's masked sum over that statement's cohort and its signed statement, and the decoded release."""
    from secure_afl import split
    from secure_afl.envelope import seal
    from secure_afl.hazmat import flp

    circuit = split.Circuit(params)
    masked = seal(params, "aggregate", flp.to_bytes(circuit.upload_share(payload)[:circuit.main_len]), contributors=1)
    manifest = {"participants": [{"hospital": HOSPITAL, "payload_sha256": upload["payload_sha256"]}],
                "aggregate_sha256": hashlib.sha256(masked).hexdigest()}
    share = split.keyholder_share(params, pair.secret_context, manifest, {HOSPITAL: upload["seed_statement"]},
                                  {HOSPITAL: ed["hospital"].public_key()})
    body, statement = split.sign_share(ed["keyholder"], params, manifest, share)
    signed = split.sign_masked_sum(ed["server"], params, statement, masked)
    return {"manifest": manifest, "share": body.hex(), "share_statement": statement, "masked_sum": masked.hex(),
            "masked_sum_statement": signed, "released": [float(f) for f in split.collect(params, masked, share)]}


# -- the Gram statement, and DP with it ------------------------------------------------------------------------
#: the fewest fractional bits the Gram factor allows without DP (its scale f = f1 / 2 >= GRAM_MIN_F): the
#: range proofs' bit widths, and so the file, grow with f1
_GRAM_FRAC_BITS = (2 * GRAM_MIN_F, 8)
_DP_SPEC = (1.0, 1e-5, 3)  # epsilon, delta, min_contributors


def _gram_session(pair, dp: bool, field: str = "goldilocks"):
    from secure_afl import split
    from secure_afl.packing import Layout
    from secure_afl.params import Bounds

    layout, bounds = Layout(2, 2), Bounds(2.0, 8, 4)
    if dp:
        from secure_afl.backends.session_params import dp_session_params
        from secure_afl.dp import DPSpec

        sid = "split-vectors-dp-gram" + ("" if field == "goldilocks" else f"-{field}")
        params = dp_session_params(DPSpec(*_DP_SPEC), "split", sid, layout, 1.0, bounds, gram_proof=True,
                                   field=field)
    else:
        params = split.split_session_params("split-vectors-gram", layout, 1.0, bounds, frac_bits=_GRAM_FRAC_BITS,
                                            gram_proof=True, field="goldilocks")
    return split.bind_public_context(params, pair.public_context)


def _prove_false(circuit, x, fw, label: str, failing: list, **kw):
    """The first labelled try of a false statement whose unmasked body breaks exactly ``failing`` (modified
    software redraws its seed until the projection rows land in range, as the attack tests do)."""
    from secure_afl.hazmat import flp

    for i in range(16):
        rand = _bytes(f"{label} rand {i}", circuit.rand_size)
        body, seed, com = circuit.prove_once(HOSPITAL, x, fw, rand, check=False, **kw)
        if circuit.evaluate(circuit.F.add(body, circuit.helper_share(seed)), com, HOSPITAL) == failing:
            return body, seed, com
    raise RuntimeError(f"no labelled try of {label} breaks exactly {failing}")  # pragma: no cover


def _sealed(params, pair, body, seed, com):
    """``(payload, its sha256, the key holder's query seed)`` for a proven body."""
    from secure_afl import split
    from secure_afl.envelope import seal
    from secure_afl.hazmat import flp

    from secure_afl.split.sizes import field_of

    payload = seal(params, "contribution", field_of(params).to_bytes(body))
    sha = hashlib.sha256(payload).hexdigest()
    return payload, sha, split.query_seed(split.query_key(pair.secret_context), params, HOSPITAL, sha, com.to_dict())


def _upload(params, pair, ed, sha, seed, com, recorded: dict | None) -> dict:
    """The honest upload's seed box (the recorded one while it opens to ``seed``) and signed statement."""
    from secure_afl import split
    from secure_afl.exceptions import SecureAFLError

    box = None
    if recorded is not None:
        try:
            old = bytes.fromhex(recorded["upload"]["box"])
            if split.open_seed(params, pair.secret_context, HOSPITAL, sha, old) == seed:
                box = old
        except (KeyError, ValueError, SecureAFLError):
            box = None
    if box is None:
        box = split.seal_seed(params, pair.public_context, HOSPITAL, sha, seed)
    statement = split.sign_seed_statement(ed["hospital"], params, HOSPITAL, sha, box, com.to_dict())
    return {"payload_sha256": sha, "validity": com.to_dict(), "seed": seed.hex(), "box": box.hex(),
            "seed_statement": statement}


def _indefinite(params) -> np.ndarray:
    """Counts (4, 4), C = diag(16, -9), Q = 0, no gamma: every entry and the trace in bounds, and every pivot
    of A / 2^t a square in F_p (-1 is one, p = 1 mod 4), so the field factor exists."""
    from secure_afl.stats import SufficientStatistics

    st = SufficientStatistics(np.diag([16.0, -9.0]), np.zeros((2, 2)), 8.0, np.array([4.0, 4.0]), 1.0, 0.0)
    return params.layout.pack(st)


def _gram(pair, ed, recorded: dict[str, dict]) -> dict[str, dict]:
    from secure_afl import split
    from secure_afl_tools.attacks_validity import field_factor, gram_cheat

    params = _gram_session(pair, dp=False)
    circuit = split.Circuit(params)
    v = _vector(params)
    x, fw = circuit.witness(v)
    rand, (body, seed, com) = _prove(circuit, x, fw, "gram honest")
    payload, sha, qs = _sealed(params, pair, body, seed, com)
    server = ed["server"]
    honest = _case(circuit, "honest", None, payload, com.to_dict(), seed, qs, server)

    lanes = circuit.lanes(_indefinite(params))
    assert field_factor(circuit, lanes) is not None
    bad = []
    for name, what, kw, failing, expect in (
            ("indefinite_field_factor", "indefinite statistics with their Cholesky factor over F_p (L L^T = A "
             "mod p, the count slack 0)", gram_cheat(circuit, lanes), ["gram_range"], "gram_range"),
            ("indefinite_stand_in_factor", "indefinite statistics with the honest upload's factor beside them",
             gram_cheat(circuit, lanes, stand_in=v), ["gram_identity"], "gram")):
        kw = dict(kw)
        b_body, b_seed, b_com = _prove_false(circuit, lanes, kw.pop("factor"), f"gram {name}", failing, **kw)
        b_payload, _, b_qs = _sealed(params, pair, b_body, b_seed, b_com)
        bad.append(_case(circuit, name, expect, b_payload, b_com.to_dict(), b_seed, b_qs, server, what))
    fields = {"params": params.to_dict(), "vector": [float(f) for f in v], "rand": rand.hex(),
              "upload": _upload(params, pair, ed, sha, seed, com, recorded.get("gram"))}
    return _instance("gram", "split with the Gram statement ([split] gram_proof) at the fewest fractional bits "
                     "its factor allows: one honest upload and the messages around it.", pair, ed, fields, honest,
                     bad)


def _dp_gram_field128(pair, ed, recorded: dict[str, dict]) -> dict[str, dict]:
    return _dp_gram(pair, ed, recorded, "field128")


def _dp_gram(pair, ed, recorded: dict[str, dict], field: str = "goldilocks") -> dict[str, dict]:
    from secure_afl import split
    from secure_afl.dp import noise_share
    from secure_afl.stats import SufficientStatistics

    inst = "dp_gram" + ("" if field == "goldilocks" else f"_{field}")
    params = _gram_session(pair, dp=True, field=field)
    circuit = split.Circuit(params)
    gs, F = circuit.part("gram"), circuit.F
    # the range a noise word is proven in: its bits' [-T_z, T_z) in Goldilocks; in Field128 the rows' 2 T_z,
    # and below that its group's l2 bound, 2^z_log2 per entry
    past = gs.T_z if not gs.noise_rows else 2 * gs.T_z + 1
    inside = gs.T_z - 1 if not gs.noise_rows else (1 << gs.g["z_log2"]) - 1
    # a bad case's file is named by the case: Field128's take names of their own
    names = ("statistics_in_the_noise", "q_residual_past_l2") if not gs.noise_rows else \
        ("statistics_past_the_noise_rows", "q_residual_past_the_groups_l2")
    said = ("+T_z, -T_z", "+-(T_z - 1)") if not gs.noise_rows else ("+(2 T_z + 1), -(2 T_z + 1)", "+-(2^z_log2 - 1)")

    def noisy(zero_lanes, z):
        hi = F.decode_signed(zero_lanes[:circuit.L]).astype(object)
        hi[gs.i_noise] += np.asarray(z, dtype=np.int64).astype(object) * gs.z_scale
        return np.concatenate([F.encode_signed(hi), zero_lanes[circuit.L:]])
    v = _vector(params)  # the statistics before the noise: the backend proves the share beside them
    # the share is a draw from numpy's seeded generator, whose stream numpy may change between releases: the
    # recorded share is kept, as the seed box is, while the session is the one it was drawn for (another noise
    # bound or scale draws afresh)
    old = recorded.get(inst)
    z = np.asarray(old["noise"], dtype=np.float64) if old is not None and old.get("params") == params.to_dict() \
        else noise_share(params, np.random.default_rng(int.from_bytes(_bytes("dp noise", 8), "big")))
    x, fw = circuit.witness(v, noise=z)
    rand, (body, seed, com) = _prove(circuit, x, fw, f"{inst} honest")
    payload, sha, qs = _sealed(params, pair, body, seed, com)
    server = ed["server"]
    honest = _case(circuit, "honest", None, payload, com.to_dict(), seed, qs, server)

    st = params.layout.unpack(v)
    gamma = params.gamma
    zero = params.layout.pack(SufficientStatistics(gamma * np.eye(2), np.zeros((2, 2)), st.n, st.class_counts, 1.0,
                                                   gamma))
    x0, fw0 = circuit.witness(zero, noise=np.zeros(circuit.L))
    r, k = np.triu_indices(2)
    diag = params.layout.slices["gram"].start + np.nonzero(r == k)[0]
    hidden = np.zeros(gs.n_z, dtype=np.int64)
    hidden[diag - gs.i_noise[0]] = [past, -past]
    lanes = noisy(x0, hidden)
    words = np.concatenate([fw0[:gs.n_f], F.encode_signed(hidden)])
    name = names[0]
    failing = ["noise_range"] + (["noise_l2"] if 2 * past ** 2 > gs.l2_z else [])
    b_body, b_seed, b_com = _prove_false(circuit, lanes, words, f"{inst} {name}", failing)
    b_payload, _, b_qs = _sealed(params, pair, b_body, b_seed, b_com)
    bad = [_case(circuit, name, "noise", b_payload, b_com.to_dict(), b_seed, b_qs, server,
                 "statistics before noise a Gram matrix (gamma I and the counts), the noise words carrying "
                 f"diag({said[0]}) grid steps, one beyond their proven range")]
    # the Q-residual: the same zero statistics, every cross-term noise word at +-(T_z - 1) (inside the per-entry
    # range), the Q lanes carrying them: only the share's l2 bound refuses it
    cross = np.arange(params.layout.slices["cross"].start, params.layout.slices["cross"].stop)
    resid = np.zeros(gs.n_z, dtype=np.int64)
    resid[cross - gs.i_noise[0]] = [inside * (-1) ** i for i in range(len(cross))]
    if int(np.sum(resid * resid)) <= gs.l2_z:  # pragma: no cover - a layout change would need a larger residual
        raise RuntimeError("the Q residual does not exceed the noise l2 bound")
    lanes = noisy(x0, resid)
    words = np.concatenate([fw0[:gs.n_f], F.encode_signed(resid)])
    name = names[1]
    b_body, b_seed, b_com = _prove_false(circuit, lanes, words, f"{inst} {name}", ["noise_l2"])
    b_payload, _, b_qs = _sealed(params, pair, b_body, b_seed, b_com)
    bad.append(_case(circuit, name, "noise", b_payload, b_com.to_dict(), b_seed, b_qs, server,
                     f"statistics before noise a Gram matrix, the noise words carrying Q at {said[1]}: every "
                     "entry in range, the share's squared l2 norm above l2_z"))
    fields = {"params": params.to_dict(), "vector": [float(f) for f in v], "noise": [float(f) for f in z],
              "rand": rand.hex(), "upload": _upload(params, pair, ed, sha, seed, com, old)}
    over = "" if field == "goldilocks" else f" over {field}, the default (the share's range by projection rows and " \
        "by groups of its l2 bound)"
    return _instance(inst, f"split with DP and the Gram statement together{over} (the noise share travels as its "
                     "own words): one honest upload with a fixed noise share and the messages around it.", pair, ed,
                     fields, honest, bad)


def recorded(root=vector_files.ROOT) -> dict[str, dict]:
    """The instances as the tree holds them, by name: those of another version (their boxes open to no upload
    of this one) and missing ones are left out, and are generated from nothing."""
    out = {}
    for name in INSTANCES:
        try:
            out[name] = vector_files.instance(OWNS, name, root)
        except (FileNotFoundError, InvalidInputError):
            continue
    return out


def files(root=vector_files.ROOT) -> dict[str, str]:
    """``{path under vectors/: text}``: every file this generator writes, the randomised values kept from
    the files under ``root`` while they still hold."""
    return {f"{OWNS}/{name}.json": vector_files.render(d) for name, d in build(recorded(root)).items()}
