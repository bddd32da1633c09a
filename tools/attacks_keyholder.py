"""A malicious server against the ckks key holder's real finalize: forwarded ciphertexts, and the CKKS
decryption-error attacks (IND-CPA-D) with and without a hospital that amplifies its own upload."""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path

import numpy as np
from secure_afl.envelope import seal
from secure_afl.exceptions import SecureAFLError

from .attack_parties import MaliciousServer, signed_participant, tagged_upload
from .harness import make_pki, sign_session
from .attack_common import fresh_keyholder, CLASSES, DIM, GAMMA, attack_bounds, attack_layout, embeddings, packed_vector, say, seal_body, untagged, workdir


# ---------------------------------------------------------------------------
# malicious server vs the key holder
# ---------------------------------------------------------------------------
def _ckks_consortium(d: Path, hospitals=("hosp-a", "hosp-b", "hosp-c")):
    from secure_afl.backends.ckks import ckks_session_params
    from secure_afl.keyholder import KeyHolder

    pki_dir = d / "pki"
    server, parties = make_pki(pki_dir, hospitals, name="attack consortium")
    b = attack_bounds()
    sign_session(pki_dir, {
        "session": {"id": "attack-forward", "backend": "ckks", "dim": DIM, "classes": CLASSES, "gamma": GAMMA,
                    "min_clients": 2, "hospitals": list(hospitals)},
        "bounds": {"max_norm": b.max_norm, "n_max": b.n_max, "k_max": b.k_max}})
    kh = KeyHolder(pki_dir, "keyholder", d / "keys", passphrase=os.urandom(16).hex().encode())
    public = kh.keygen(ckks_session_params("attack-forward", attack_layout(), GAMMA, attack_bounds()))
    return pki_dir, server, parties, kh, kh.params("attack-forward"), public


def _ckks_round(d: Path, rng, honest: slice = slice(None)):
    """The ckks consortium, a random packed vector per hospital (in name order) and the signed, tagged upload
    of each hospital in ``names[honest]`` (an attacking hospital builds its own). Returns (pki_dir, server
    party, {hospital: party}, key holder, params, public context, backend, names, vectors, uploads)."""
    from secure_afl.backends.ckks import CKKSBackend

    pki_dir, server_party, parties, kh, params, public = _ckks_consortium(d)
    backend = CKKSBackend(params)
    names = sorted(parties)
    vecs = {h: packed_vector(*embeddings(rng, 15)) for h in names}
    uploads = {h: tagged_upload(parties[h], params, backend, public, vecs[h]) for h in names[honest]}
    return pki_dir, server_party, parties, kh, params, public, backend, names, vecs, uploads


def _payloads_and_tags(uploads: dict, names) -> tuple[dict, dict]:
    """``{hospital: (payload, tag statement)}`` as the two maps a server serves, in ``names`` order."""
    return {h: uploads[h][0] for h in names}, {h: uploads[h][1] for h in names}


def _relay(server_party, params, parties, payloads: dict, tags: dict) -> MaliciousServer:
    """A server that serves the key holder every hospital's upload as it was made (min_clients = 2)."""
    return MaliciousServer(server_party, params, [signed_participant(parties[h], params, payloads[h])
                                                  for h in payloads], payloads, tags, min_clients=2)


def _decryptions(keyholder, params) -> int:
    from secure_afl.release_checks import ReleaseLedger

    ledger = ReleaseLedger(keyholder.keys_dir / "releases.sqlite3")
    try:
        return ledger.decryption_count(params.backend_params["public_context_sha256"])
    finally:
        ledger.close()


def attack_forward_ciphertext(*, seed: int = 0, verbose: bool = True, work=None, **_) -> dict:
    """A malicious server tries to have one hospital's statistics decrypted (real finalize path)."""
    from secure_afl.envelope import peek_header, seal
    from secure_afl.hazmat import ckks as hz

    rng = np.random.default_rng(seed)
    with workdir(work) as d:
        d = Path(d)
        pki_dir, server_party, parties, kh, params, public, backend, names, vecs, uploads = _ckks_round(d, rng)
        payloads, tags = _payloads_and_tags(uploads, names)
        signed = {h: signed_participant(parties[h], params, payloads[h]) for h in names}
        K, lay = len(names), attack_layout()
        victim = names[0]
        truth = lay.unpack(sum(vecs.values()))
        mine = lay.unpack(vecs[victim])

        # the server can encrypt anything under the public key: a fix-up that makes the
        # victim's vector look like a K-sum (contributor counter K, K gamma on the Gram diagonal)
        fix = np.zeros(lay.length)
        fix[lay.slices["contributors"]] = K - 1
        iu = np.triu_indices(DIM)
        fix[lay.slices["gram"]] = np.where(iu[0] == iu[1], (K - 1) * GAMMA, 0.0)
        ctx = hz.load_context(public, backend.ckks_, secret=False)

        def victim_plus(*extra: bytes) -> bytes:
            acc = backend.load_contribution(ctx, payloads[victim])
            for p in extra:
                acc = hz.add_chunks(acc, backend.load_contribution(ctx, p))
            return seal(params, "contribution", hz.dump_chunks(acc, lay.length))

        fixup = backend.protect(fix, public_context=public)
        forged = victim_plus(fixup)
        zero = backend.protect(np.zeros(lay.length), public_context=public)
        others = {h: payloads[h] for h in names}
        variants = [
            ("manifest listing only the victim (server's min_clients = 1)", [signed[victim]], others, 1, b""),
            ("victim + Enc(fix-up) served as another hospital's upload", list(signed.values()),
             {**others, names[1]: forged}, K, b""),
            ("victim's ciphertext served for every participant", list(signed.values()),
             {h: payloads[victim] for h in names}, K, b""),
            ("server signs an upload statement in a hospital's name",
             [signed[victim], {**signed[names[1]], "payload_sha256": hashlib.sha256(zero).hexdigest()}],
             {**others, names[1]: zero}, 2, b""),
            ("honest uploads, server's 'aggregate' = victim + Enc(fix-up)", list(signed.values()), others, K,
             seal(params, "aggregate", peek_header(forged).body, contributors=K)),
        ]
        results = []
        for i, (label, parts, served, mc, aggregate) in enumerate(variants):
            keyholder = fresh_keyholder(kh, pki_dir, d, str(i))
            server = MaliciousServer(server_party, params, parts, served, tags, min_clients=mc, aggregate=aggregate)
            try:
                res = keyholder.finalize(server, min_clients=2)
                # measured: is what was released the victim's statistics or the honest K-sum?
                to_victim = float(np.max(np.abs(res.stats.cross - mine.cross)))
                to_sum = float(np.max(np.abs(res.stats.cross - truth.cross)))
                outcome = "recovered" if to_victim < to_sum else "released_honest_sum"
                out = {"variant": label, "outcome": outcome, "distance_to_victim": to_victim,
                       "distance_to_honest_sum": to_sum, "decryptions": _decryptions(keyholder, params)}
                say(verbose, f"[forward-ciphertext] {outcome.upper()} ({label}): released Q is {to_victim:.2e} "
                              f"from the victim's, {to_sum:.2e} from the honest sum")
            except SecureAFLError as e:
                out = {"variant": label, "outcome": "refused", "error": type(e).__name__, "reason": e.reason,
                       "decryptions": _decryptions(keyholder, params)}
                say(verbose, f"[forward-ciphertext] REFUSED ({label}): {type(e).__name__}({e.reason}), "
                              f"{out['decryptions']} decryptions: {str(e)[:110]}")
            results.append(out)
    recovered = any(r["outcome"] == "recovered" for r in results)
    return {"attack": "forward-ciphertext", "outcome": "recovered" if recovered else "refused",
            "variants": results,
            "decrypted_before_refusal": sum(r["decryptions"] for r in results if r["outcome"] == "refused"),
            "honest_released": results[-1]["outcome"] == "released_honest_sum"}


def attack_decryption_error(*, seed: int = 0, verbose: bool = True, work=None, flood: bool = True, **_) -> dict:
    """IND-CPA-D: does a release give the attacker the decryption error (the key-recovery input)?

    Li and Micciancio's attack needs the exact error e of a decryption whose
    message the attacker knows (chunks built from the public key, t*(b, a),
    are the extreme case: their message is 0, the release IS t*e, and s
    follows by linear algebra). Here the attacker knows every hospital's
    plaintext (worst case: all of them collude with the server), runs the real
    finalize, and estimates e as release - known sum. The verdict compares that
    estimate with the true error, measured with the key holder's secret key.
    ``flood=False`` measures the same release without the key holder's noise.
    """
    from secure_afl.hazmat import ckks as hz

    rng = np.random.default_rng(seed)
    with workdir(work) as d:
        d = Path(d)
        pki_dir, server_party, parties, kh, params, public, backend, names, vecs, uploads = _ckks_round(d, rng)
        payloads, tags = _payloads_and_tags(uploads, names)
        server = _relay(server_party, params, parties, payloads, tags)
        lay = attack_layout()
        known = sum(v.copy() for v in vecs.values())
        res = kh.finalize(server, min_clients=2) if flood else None
        # ground truth, measured with the secret key (the attacker never has it)
        sk = backend.keyholder_context(kh.secret_context(params.session_id))
        acc = None
        for h in names:
            acc = hz.add_chunks(acc, backend.load_contribution(sk, payloads[h]))
        raw = hz.decrypt_chunks(sk, acc, lay.length)
        # the released statistics: more than the published W and report, so an upper bound on the leak
        released = lay.pack(res.stats) if flood else raw
        idx = np.arange(lay.length)
        sl = np.concatenate([idx[lay.slices["gram"]], idx[lay.slices["cross"]]])
        true_e = (raw - known)[sl]
        est_e = (released - known)[sl]
        corr = float(np.corrcoef(true_e, est_e)[0, 1])
        residual = float(np.linalg.norm(est_e - true_e) / np.linalg.norm(true_e))
        recovered = residual < 0.5  # the estimate holds most of e: the linear-algebra step goes through
        say(verbose, f"[decryption-error] {'RECOVERED' if recovered else 'REFUSED'}: attacker's estimate of the "
                      f"decryption error has relative residual {residual:.3e} (correlation {corr:.3f}); "
                      f"flood sigma {res.report['flood_sigma'] if res else 0.0:.2e}")
    return {"attack": "decryption-error", "outcome": "recovered" if recovered else "refused",
            "residual": residual, "correlation": corr, "error_rms": float(np.sqrt(np.mean(true_e ** 2))),
            "flood_sigma": res.report["flood_sigma"] if res else 0.0}


def attack_noisy_upload(*, seed: int = 0, verbose: bool = True, work=None, doublings: int = 30, **_) -> dict:
    """A hospital adds 2^t Enc(0) to its own signed upload: its key-dependent error times 2^t.

    The flooding is sized for the error of fresh encryptions; CKKS ciphertexts
    carry no proof of freshness, so a hospital (with the server, knowing every
    plaintext) can multiply the key-dependent error e0 of an encryption of zero
    by 2^t and add it to its upload. The key holder's real finalize then either
    refuses (a check sees the error, its message carries no decrypted value) or
    releases. The verdict: RECOVERED when the published statistics give an
    estimate of the amplified error with relative residual below 1/2 (what
    key recovery needs), else REFUSED. ``released_within_bound`` says whether
    every released statistic stayed within the key holder's reported bound.
    """
    from secure_afl.hazmat import ckks as hz
    from secure_afl.tagging import new_tag, seal_tag, sign_tag

    rng = np.random.default_rng(seed)
    with workdir(work) as d:
        d = Path(d)
        pki_dir, server_party, parties, kh, params, public, backend, names, vecs, uploads = \
            _ckks_round(d, rng, honest=slice(1, None))
        cp = backend.ckks_  # the session's CKKS parameters, derived once by the backend
        lay = attack_layout()
        # the attacker's upload: its honest ciphertext plus 2^t encryptions of zero, then signed as usual
        attacker = names[0]
        tag = new_tag(params)
        v = vecs[attacker].copy()
        v[lay.slices["tag"]] = tag
        pub = hz.load_context(public, cp, secret=False)
        honest = hz.load_chunks(pub, cp, seal_body(backend.protect(v, public_context=public)), lay.length,
                                backend.breaks)
        zero = hz.load_chunks(pub, cp, seal_body(backend.protect(np.zeros(lay.length), public_context=public)),
                              lay.length, backend.breaks)
        for _ in range(int(doublings)):
            zero = hz.add_chunks(zero, [c.copy() for c in zero])
        payload = seal(params, "contribution", hz.dump_chunks(hz.add_chunks(honest, zero), lay.length))
        statement = sign_tag(parties[attacker].identity_key(), params, attacker, hashlib.sha256(payload).hexdigest(),
                             seal_tag(params, attacker, tag))
        uploads[attacker] = (payload, statement)
        vecs[attacker] = v
        for h in names[1:]:
            vecs[h] = vecs[h].copy()
        payloads, tags = _payloads_and_tags(uploads, names)
        server = _relay(server_party, params, parties, payloads, tags)
        # ground truth, measured with the secret key (the attacker never has it)
        sk = backend.keyholder_context(kh.secret_context(params.session_id))
        acc = None
        for h in names:
            acc = hz.add_chunks(acc, backend.load_contribution(sk, payloads[h]))
        raw = hz.decrypt_chunks(sk, acc, lay.length)
        known = lay.pack(lay.unpack(sum(untagged(lay, vecs[h]) for h in names), gamma=GAMMA))
        idx = np.arange(lay.length)
        sl = np.concatenate([idx[lay.slices["gram"]], idx[lay.slices["cross"]]])
        true_e = (raw - known)[sl]
        try:
            res = kh.finalize(server, min_clients=2)
        except Exception as e:  # the refusal is the outcome; its message is recorded
            say(verbose, f"[noisy-upload] REFUSED: 2^{doublings} Enc(0) added; the key holder refused the release: "
                          f"{type(e).__name__}({getattr(e, 'reason', '')}): {e}. ckks assumes hospitals encrypt "
                          "honestly: where they may not, use split or bfv")
            return {"attack": "noisy-upload", "outcome": "refused", "released": False, "message": str(e),
                    "amplified_error_rms": float(np.sqrt(np.mean(true_e ** 2))), "report": None}
        released = lay.pack(res.stats)
        est_e = (released - known)[sl]
        residual = float(np.linalg.norm(est_e - true_e) / np.linalg.norm(true_e))
        within = bool(np.max(np.abs(released - known)[np.r_[sl, idx[lay.slices["counts"]], idx[lay.slices["n"]]]])
                      <= res.report["error_bound_per_entry"])
        recovered = residual < 0.5
        rms = float(np.sqrt(np.mean(true_e ** 2)))
        # what one released slot tells about the amplified error: a Gaussian channel at that signal-to-noise
        bits = 0.5 * math.log2(1.0 + (rms / res.report["flood_sigma"]) ** 2)
        say(verbose, f"[noisy-upload] {'RECOVERED' if recovered else 'REFUSED'}: 2^{doublings} Enc(0) added, "
                      f"amplified error rms {rms:.2e} vs flood sigma {res.report['flood_sigma']:.2e} "
                      f"({bits:.2f} bits per slot); the attacker's estimate has relative residual "
                      f"{residual:.3g}; released statistics within the reported bound: {within}. ckks assumes "
                      "hospitals encrypt honestly: where they may not, use split or bfv")
    return {"attack": "noisy-upload", "outcome": "recovered" if recovered else "refused", "released": True,
            "residual": residual, "released_within_bound": within, "report": res.report, "W": res.W,
            "bits_per_slot": bits,
            "amplified_error_rms": float(np.sqrt(np.mean(true_e ** 2))), "flood_sigma": res.report["flood_sigma"]}


