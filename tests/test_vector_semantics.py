"""What the recorded derivations in vectors/split/ and vectors/secagg/ mean, checked from the documented
formulas, not by byte comparison.

tests/test_vector_files.py regenerates the files and compares bytes: it pins the
wire format, but a derivation that changed on purpose or by mistake is regenerated with it. Here each derived
value is recomputed by code of the test's own, from ``cryptography``, ``hashlib`` and ``hmac`` and the formulas
of docs/VALIDITY.md, docs/SESSION.md and threat_model/ (the domain strings written out as the documents publish
them), and must equal what the file records. Each test then asks the library for the same value on the
recorded inputs (or to judge the recorded case), so a library whose derivation drifts from the document fails
here even before anyone regenerates the files.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import struct
from fractions import Fraction

import numpy as np
import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, hpke
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.mlkem import MLKEM768PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from support import VECTORS as VECTOR_DIR

P = 2 ** 64 - 2 ** 32 + 1  # the split field (docs/VALIDITY.md, "Field and encoding")

# -- independent primitives (nothing from secure_afl) ---------------------------------------------------------


def canon(obj) -> bytes:
    """The canonical JSON every hashed or signed object is serialised as: sorted keys, no spaces, ASCII."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def chacha_field(key: bytes, domain: bytes, n: int) -> list[int]:
    """``n`` field elements: the ChaCha20 keystream (key, counter 0, nonce = the 12-byte domain) read as
    little-endian 64-bit words, those >= p skipped."""
    enc = Cipher(algorithms.ChaCha20(key, bytes(4) + domain), mode=None).encryptor()
    out: list[int] = []
    while len(out) < n:
        block = enc.update(bytes(8 * 64))
        out += [w for w in struct.unpack(f"<{len(block) // 8}Q", block) if w < P]
    return out[:n]


def envelope_body(payload: bytes, kind: str) -> tuple[dict, bytes]:
    """``SAFLPAY1 | u32 LE header length | canonical JSON header | body``; the header names the body's hash."""
    assert payload[:8] == b"SAFLPAY1"
    (hlen,) = struct.unpack("<I", payload[8:12])
    header = json.loads(payload[12:12 + hlen])
    body = payload[12 + hlen:]
    assert header["kind"] == kind and header["body_sha256"] == hashlib.sha256(body).hexdigest()
    return header, body


def words(raw: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(raw) // 8}Q", raw))


def centred(w: int) -> int:
    return w - P if w > P // 2 else w


def encode_lanes(vector, f1: int, f2: int) -> list[int]:
    """The two-lane fixed point (secure_afl/hazmat/fixedpoint.py's docstring): hi = round-half-even(v 2^f1),
    lo = round((v 2^f1 - hi) 2^f2); signed integers carried as field elements."""
    hi, lo = [], []
    for v in vector:
        x = Fraction(v) * 2 ** f1
        h = round(x)
        hi.append(h)
        lo.append(round((x - h) * 2 ** f2))
    return [z % P for z in hi + lo]


def decode_lanes(w: list[int], f1: int, f2: int) -> list[Fraction]:
    half = len(w) // 2
    return [Fraction(centred(h) * 2 ** f2 + centred(lo), 2 ** (f1 + f2)) for h, lo in zip(w[:half], w[half:])]


def vector_files(protocol: str, name: str) -> tuple[dict, list[dict]]:
    """An instance of vectors/<protocol>/ and its bad cases in the order it lists them (each in
    bad_<case>.json beside it), read as plain JSON."""
    folder = VECTOR_DIR / protocol
    inst = json.loads((folder / f"{name}.json").read_text())
    return inst, [json.loads((folder / f"bad_{case}.json").read_text()) for case in inst["bad_cases"]]


def ed25519_verifies(public_key, prefix: bytes, signed: dict, field: str = "signature") -> bool:
    body = {k: v for k, v in signed.items() if k != field}
    try:
        public_key.verify(bytes.fromhex(signed[field]), prefix + canon(body))
        return True
    except InvalidSignature:
        return False


# -- split ----------------------------------------------------------------------------------------------------
SECTIONS, SPLIT_BAD = {}, {}
for _name in ("plain", "gram", "dp_gram"):
    SECTIONS[_name], SPLIT_BAD[_name] = vector_files("split", _name)
SPLIT = SECTIONS["plain"]
SPLIT_CASES = [(s, c) for s, sec in SECTIONS.items() for c in (sec["honest"], *SPLIT_BAD[s])]
SPLIT_IDS = [f"{s}-{c['name']}" for s, c in SPLIT_CASES]
SECRET = bytes.fromhex(SPLIT["keys"]["keyholder_secret_key"])
HOSPITAL = SPLIT["hospital"]
ED = {who: Ed25519PrivateKey.from_private_bytes(bytes.fromhex(SPLIT["keys"][f"{who}_ed25519"])).public_key()
      for who in ("hospital", "server", "keyholder")}
# the published domain strings (secure_afl/domains.py states them; docs/VALIDITY.md names where each enters)
SEED_HPKE_INFO = b"secure-afl/split/seed-hpke/v2"
VALIDITY_FS = b"secure-afl/split/validity/v1\0"
QUERY_KEY_INFO = b"secure-afl/split/query-key/v1"
QUERY = b"secure-afl/split/query/v1\0"
SIG_SEED, SIG_VERIFIER = b"secure-afl/split/seed/v1\0", b"secure-afl/split/verifier/v1\0"
SIG_SHARE, SIG_SUM = b"secure-afl/split/share/v1\0", b"secure-afl/split/sum/v1\0"
SHARE_XOF = b"saflSPLITfld"


def params_digest(section: str) -> str:
    return hashlib.sha256(canon(SECTIONS[section]["params"])).hexdigest()


def _params(section: str):
    from secure_afl.params import SessionParams

    return SessionParams.from_dict(SECTIONS[section]["params"])


def _circuit(section: str):
    from secure_afl import split

    return split.Circuit(_params(section))


def test_split_keys_are_the_ml_kem_and_x25519_keys_of_the_secret_and_the_session_names_them():
    # Execute: the public key from the secret key (ML-KEM-768 seed || X25519 private key), by cryptography
    mk = MLKEM768PrivateKey.from_seed_bytes(SECRET[:64])
    xk = X25519PrivateKey.from_private_bytes(SECRET[64:])
    public = mk.public_key().public_bytes_raw() + xk.public_key().public_bytes_raw()
    digest = hashlib.sha256(public).hexdigest()

    # Assert: the file's digest and every section's session parameters name that key; the library agrees
    from secure_afl import split

    assert digest == SPLIT["keys"]["keyholder_public_key_sha256"]
    for section in SECTIONS:
        assert SECTIONS[section]["params"]["backend_params"]["public_context_sha256"] == digest
        assert _params(section).digest().hex() == params_digest(section)
    assert split.bind_public_context(_params("plain"), public).backend_params["public_context_sha256"] == digest


@pytest.mark.parametrize("section", list(SECTIONS))
def test_split_seed_box_opens_by_rfc9180_to_the_seed_and_the_seed_digest_is_the_documented_hash(section):
    sec = SECTIONS[section]
    up = sec["upload"]
    ad = canon({"session_id": sec["params"]["session_id"], "params_digest": params_digest(section),
                "hospital": HOSPITAL, "payload_sha256": up["payload_sha256"]})

    # Execute: HPKE single-shot open, info = SPLIT_SEED_HPKE || 0 || AD, straight from cryptography
    suite = hpke.Suite(hpke.KEM.MLKEM768_X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)
    key = hpke.MLKEM768X25519PrivateKey(MLKEM768PrivateKey.from_seed_bytes(SECRET[:64]),
                                        X25519PrivateKey.from_private_bytes(SECRET[64:]))
    seed = suite.decrypt(bytes.fromhex(up["box"]), key, info=SEED_HPKE_INFO + b"\0" + ad)

    # Assert: the recorded seed, committed to as SHA-256(validity domain || "seed" 0 || seed); the library opens
    # the box to it and digests it the same way
    from secure_afl import split

    assert seed.hex() == up["seed"] == sec["honest"]["seed"]
    assert hashlib.sha256(VALIDITY_FS + b"seed\0" + seed).hexdigest() == up["validity"]["seed_sha256"]
    assert split.open_seed(_params(section), SECRET, HOSPITAL, up["payload_sha256"], bytes.fromhex(up["box"])) == seed
    assert split.seed_digest(seed) == up["validity"]["seed_sha256"]


def test_the_kat_seed_box_opens_by_rfc9180_to_its_seed():
    kat = json.loads((VECTOR_DIR / "split_seed_box.json").read_text())
    sk = bytes.fromhex(kat["secret_key"])
    suite = hpke.Suite(hpke.KEM.MLKEM768_X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)
    key = hpke.MLKEM768X25519PrivateKey(MLKEM768PrivateKey.from_seed_bytes(sk[:64]),
                                        X25519PrivateKey.from_private_bytes(sk[64:]))
    info = SEED_HPKE_INFO + b"\0" + kat["ad"].encode()
    assert suite.decrypt(bytes.fromhex(kat["box"]), key, info=info).hex() == kat["seed"]

    from secure_afl import split

    assert split.open_box(sk, kat["ad"].encode(), bytes.fromhex(kat["box"])).hex() == kat["seed"]


@pytest.mark.parametrize("section,case", SPLIT_CASES, ids=SPLIT_IDS)
def test_split_query_seed_is_the_hmac_of_the_committed_upload_under_the_hkdf_query_key(section, case):
    sec = SECTIONS[section]
    payload = bytes.fromhex(case["payload"])
    sha = hashlib.sha256(payload).hexdigest()
    assert sha == case["payload_sha256"]

    # Execute: K = HKDF-SHA256(secret seed key, info = query-key domain); seed = HMAC-SHA256(K, domain || upload)
    k = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=QUERY_KEY_INFO).derive(SECRET)
    upload = canon({"session_id": sec["params"]["session_id"], "params_digest": params_digest(section),
                    "hospital": HOSPITAL, "payload_sha256": sha, "validity": case["validity"]})
    qs = hmac.new(k, QUERY + upload, hashlib.sha256).digest()

    # Assert: the recorded query seed, the one the server signed its message at; the library derives the same
    from secure_afl import split

    if case["name"] != "message_for_another_payload":
        assert qs.hex() == case["query_seed"] == case["server_message"]["query_seed"]
    assert qs.hex() == case["query_seed"]
    assert split.query_seed(split.query_key(SECRET), _params(section), HOSPITAL, sha, case["validity"]) == qs


@pytest.mark.parametrize("section,case", SPLIT_CASES, ids=SPLIT_IDS)
def test_split_commitment_and_fiat_shamir_seed_are_the_documented_hashes_of_the_uploaded_words(section, case):
    sec = SECTIONS[section]
    circuit = _circuit(section)
    _, body = envelope_body(bytes.fromhex(case["payload"]), "contribution")
    w = words(body)
    assert len(w) == circuit.total and max(w) < P

    # Execute: main = SHA-256(lanes and statement words), aux = SHA-256(bits) of the masked upload; then
    # fs = SHA-256(validity domain || {session, parameters digest, hospital, main, seed digest})
    main = hashlib.sha256(body[:8 * circuit.commit_len]).hexdigest()
    aux = hashlib.sha256(body[8 * circuit.commit_len:8 * (circuit.commit_len + circuit.n_bits)]).hexdigest()
    fs = hashlib.sha256(VALIDITY_FS + canon({
        "session_id": sec["params"]["session_id"], "params_digest": params_digest(section), "hospital": HOSPITAL,
        "main_sha256": main, "seed_sha256": case["validity"]["seed_sha256"]})).digest()
    # the joint randomness's key binds the field's name and the repetition count (name, NUL, one byte)
    circuit_id = sec["params"]["backend_params"]["field"].encode() + b"\0" + bytes([circuit.reps])
    joint_key = hashlib.sha256(fs + b"joint\0" + circuit_id + bytes.fromhex(aux)).digest()
    # the query randomness: SHA-256(its label || the same binding || query seed || fs || aux), expanded
    qs = bytes.fromhex(case["query_seed"])
    query_key = hashlib.sha256(b"secure-afl/split/query-rand/v2\0" + circuit_id + qs + fs +
                               bytes.fromhex(aux)).digest()
    stream = chacha_field(query_key, b"saflVALIDqry", 4 * circuit.reps + 2 * circuit.n_relations)

    # Assert: the hospital's signed commitment names those words (the tampered proof changes a word it does not
    # cover); the library's Fiat-Shamir seed and joint randomness are these
    assert case["validity"]["main_sha256"] == main and case["validity"]["aux_sha256"] == aux
    assert circuit.fs_seed(HOSPITAL, main, case["validity"]["seed_sha256"]) == fs
    assert circuit.joint_rand(fs, aux) == chacha_field(joint_key, b"saflVALIDjnt", circuit.reps)
    pts, coeffs = circuit.query_rand(fs, aux, qs)
    assert sec["params"]["backend_params"]["field"] == "goldilocks"
    assert pts == [t for t in stream[:4 * circuit.reps] if pow(t, circuit.bits.n, P) != 1][:circuit.reps]
    assert [int(c) for c in coeffs.ravel()] == stream[4 * circuit.reps:]


@pytest.mark.parametrize("section", list(SECTIONS))
def test_split_shares_sum_to_the_recorded_statistics(section):
    sec = SECTIONS[section]
    circuit = _circuit(section)
    f1, f2 = sec["params"]["backend_params"]["frac_bits"]
    _, body = envelope_body(bytes.fromhex(sec["honest"]["payload"]), "contribution")
    seed = bytes.fromhex(sec["upload"]["seed"])

    # Execute: the key holder's share is -m, m = ChaCha20 field words of the seed (the split share domain); the
    # server's share is the uploaded words; their sum is the upload w
    mask = chacha_field(seed, SHARE_XOF, circuit.total)
    w = [(y - m) % P for y, m in zip(words(body), mask)]
    lanes = w[:circuit.main_len]

    # Assert: the lanes hold the recorded statistics (exactly in the plain statement; the Gram statement uploads
    # them snapped onto its grid, and DP adds the noise share), and the library's shares are the same words
    from secure_afl.hazmat import flp

    vector = sec["vector"]
    if section == "plain":
        assert lanes == encode_lanes(vector, f1, f2)
    else:
        _check_gram_identity(sec, w[circuit.main_len:circuit.main_len + circuit.n_f], lanes, f1)
    assert [int(v) for v in circuit.helper_share(seed)] == [(-m) % P for m in mask]
    ours = flp.add(circuit.leader_share(body), circuit.helper_share(seed))
    assert [int(v) for v in ours] == w


def _check_gram_identity(sec: dict, factor_words: list[int], lanes: list[int], f1: int) -> None:
    """docs/VALIDITY.md, "What the hospital uploads and proves": the factor L (lower triangular, scale 2^f,
    f = floor(f1 / 2), t = f1 - 2f) is the count block's diagonal l_c = floor(sqrt(count_c) 2^f), then the d x C
    block and the d x d triangle, row by row; the Gram, cross and count lanes are exactly 2^t L L^T (low lanes 0,
    the counts unchanged), after the noise share's words are taken off under DP; and each snapped entry is within
    2^-f (|L_i|_1 + |L_j|_1) + m 2^-2f of the hospital's own statistics."""
    d, C = sec["params"]["layout"]["dim"], sec["params"]["layout"]["n_classes"]
    m, f = C + d, f1 // 2
    t = f1 - 2 * f
    fw = [centred(x) for x in factor_words]
    n_factor = C + d * C + d * (d + 1) // 2
    z = fw[n_factor:]  # the noise share's words (DP with the Gram statement), one per noised entry
    Lm = [[0] * m for _ in range(m)]
    for c in range(C):
        Lm[c][c] = fw[c]
    for i in range(d):
        Lm[C + i][:C] = fw[C + i * C:C + (i + 1) * C]
    k = C + d * C
    for i in range(d):
        for j in range(i + 1):
            Lm[C + i][C + j], k = fw[k], k + 1
    LLt = [[2 ** t * sum(Lm[i][x] * Lm[j][x] for x in range(m)) for j in range(m)] for i in range(m)]
    half = len(lanes) // 2
    hi, lo = [centred(x) for x in lanes[:half]], [centred(x) for x in lanes[half:]]
    # lane order: triu(gram), cross (d x C row by row), n, counts, then the rest (docs/SESSION.md's layout)
    gram_idx = [(i, j) for i in range(d) for j in range(i, d)]
    want = [LLt[C + i][C + j] for i, j in gram_idx] + [LLt[C + i][c] for i in range(d) for c in range(C)]
    n_stat = len(want)
    counts = [round(v) for v in sec["vector"][n_stat + 1:n_stat + 1 + C]]
    noise = z + [0] * (n_stat + 1 + C - len(z))
    assert all(0 <= Lm[c][c] and Lm[c][c] ** 2 <= counts[c] * 4 ** f < (Lm[c][c] + 1) ** 2 for c in range(C))
    assert [h - e for h, e in zip(hi, noise)][:n_stat] == want
    assert [h - e for h, e in zip(hi[n_stat:], noise[n_stat:])][:1 + C] == \
        [round(sec["vector"][n_stat] * 2 ** f1)] + [cnt * 2 ** f1 for cnt in counts]
    assert lo[:n_stat + 1 + C] == [0] * (n_stat + 1 + C)
    assert lanes[n_stat + 1 + C:half] == encode_lanes(sec["vector"][n_stat + 1 + C:], f1, 0)[:half - n_stat - 1 - C]
    # the snapping moved each statistic by no more than the documented bound; the Gram diagonal also carries
    # the factorisation's jitter max(0, 2E - gamma), E = 2^-f (4 B^2 + 2 sqrt(2 d) B) sqrt(C n_max) + C d 2^-2f
    # (docs/VALIDITY.md, "Jitter"), which is not 0 at the DP section's coarse factor scale
    b = sec["params"]["bounds"]
    B, n_max = b["max_norm"], b["n_max"]
    e_jit = 2.0 ** -f * (4 * B * B + 2 * math.sqrt(2 * d) * B) * math.sqrt(C * n_max) + C * d * 2.0 ** (-2 * f)
    jitter = max(0.0, 2 * e_jit - sec["params"]["gamma"])
    row1 = [Fraction(sum(abs(x) for x in row), 2 ** f) for row in Lm]
    pairs = [(C + i, C + j) for i, j in gram_idx] + [(C + i, c) for i in range(d) for c in range(C)]
    for (i, j), h, e, v in zip(pairs, hi, noise, sec["vector"]):
        target = Fraction(v) + (Fraction(jitter) if i == j and i >= C else 0)
        assert abs(Fraction(h - e, 2 ** f1) - target) <= (row1[i] + row1[j]) / 2 ** f + Fraction(m, 4 ** f) + \
            Fraction(1, 2 ** f1)


@pytest.mark.parametrize("section,case", SPLIT_CASES, ids=SPLIT_IDS)
def test_split_signatures_verify_under_the_recorded_keys_over_the_documented_statements(section, case):
    sec = SECTIONS[section]
    up = sec["upload"]
    digest = params_digest(section)
    seed_st = up["seed_statement"]
    server_msg = case["server_message"]

    # Assert: the hospital's seed statement (prefix || canonical JSON) over this session, payload, box and
    # commitment, and the server's verifier message over the upload it was formed for
    assert ed25519_verifies(ED["hospital"], SIG_SEED, seed_st)
    assert {k: seed_st[k] for k in ("session_id", "params_digest", "hospital", "payload_sha256", "box", "validity")} \
        == {"session_id": sec["params"]["session_id"], "params_digest": digest, "hospital": HOSPITAL,
            "payload_sha256": up["payload_sha256"], "box": up["box"], "validity": up["validity"]}
    assert ed25519_verifies(ED["server"], SIG_VERIFIER, server_msg)
    assert not ed25519_verifies(ED["hospital"], SIG_VERIFIER, server_msg)
    forged_for = {**server_msg, "payload_sha256": case["payload_sha256"]}
    if case["name"] == "message_for_another_payload":
        # signed, but for another upload: the statement the key holder expects for this one does not verify
        assert server_msg["payload_sha256"] != case["payload_sha256"]
        assert not ed25519_verifies(ED["server"], SIG_VERIFIER, forged_for)
    else:
        assert server_msg["payload_sha256"] == case["payload_sha256"]

    # the library accepts and refuses the same ones
    from secure_afl import split
    from secure_afl.exceptions import InvalidSignature as Refused

    assert split.verify_seed_statement(seed_st, ED["hospital"], _params(section), HOSPITAL,
                                       up["payload_sha256"]).hex() == up["box"]
    check = lambda: split.verify_leader_message(server_msg, ED["server"], _circuit(section), HOSPITAL,  # noqa: E731
                                                case["payload_sha256"], bytes.fromhex(case["query_seed"]))
    if case["name"] == "message_for_another_payload":
        with pytest.raises(Refused):
            check()
    else:
        check()


def _bit_proof_accepts(v: list[int], chunk: int) -> bool:
    """One bit proof's verifier sum: ``out = 0`` and ``P(t) = sum_j U_j(t) V_j(t)`` (docs/VALIDITY.md)."""
    return v[0] == 0 and sum(a * b for a, b in zip(v[1:1 + chunk], v[1 + chunk:1 + 2 * chunk])) % P == v[-1]


@pytest.mark.parametrize("section,case", SPLIT_CASES, ids=SPLIT_IDS)
def test_split_verdict_is_what_the_two_recorded_verifier_messages_decide(section, case):
    circuit = _circuit(section)
    kh = case["keyholder"]
    seed = bytes.fromhex(case["seed"])
    seed_ok = hashlib.sha256(VALIDITY_FS + b"seed\0" + seed).hexdigest() == case["validity"]["seed_sha256"]

    # Execute: sum the server's and the key holder's messages word by word; the first two words are the affine
    # checks, then one bit-proof verifier per repetition (2c + 2 words each), then the statement's own
    if kh.get("message") is not None:
        a = words(bytes.fromhex(case["server_message"]["message"]))
        b = words(bytes.fromhex(kh["message"]))
        v = [(x + y) % P for x, y in zip(a, b)]
        k = circuit.bits.verifier_len
        linear_ok = v[0] == v[1] == 0
        bits_ok = all(_bit_proof_accepts(v[2 + r * k:2 + (r + 1) * k], circuit.bits.chunk) for r in range(circuit.reps))

    # Assert: the recorded verdict is the first check that fails (the statement's own checks only when the
    # affine and bit checks pass); a seed that misses the commitment is refused before any message
    expected = "exception" if "exception" in kh else kh["verdict"]
    if expected == "exception":
        assert case["name"] == "message_for_another_payload" and kh["exception"] == "InvalidSignature"
    elif expected == "commitment":
        assert not seed_ok and kh["message"] is None
    else:
        assert seed_ok
        assert linear_ok == (expected != "linear")
        if expected != "linear":  # past the affine checks, the bit proofs decide before the statement's own
            assert bits_ok == (expected != "bits")
        if expected is None:
            assert case["name"] == "honest"

    # the library, given the recorded messages, decides the same and refuses with the recorded reason
    from secure_afl import split
    from secure_afl.exceptions import SecureAFLError
    from secure_afl.hazmat import flp

    try:
        _, leader = split.verify_leader_message(case["server_message"], ED["server"], circuit, HOSPITAL,
                                                case["payload_sha256"], bytes.fromhex(case["query_seed"]))
        verdict = split.helper_verdict(circuit, HOSPITAL, seed, {"validity": case["validity"]},
                                       bytes.fromhex(case["query_seed"]), leader)
    except SecureAFLError as e:
        assert type(e).__name__ == kh["exception"]
        return
    assert verdict == kh["verdict"]
    if kh["message"] is not None:
        assert circuit.decide(leader, flp.from_bytes(bytes.fromhex(kh["message"]))) == kh["verdict"]


def test_split_release_is_the_masked_sum_plus_the_negated_seed_mask_and_both_statements_are_signed():
    rel = SPLIT["release"]
    circuit = _circuit("plain")
    f1, f2 = SPLIT["params"]["backend_params"]["frac_bits"]
    digest = params_digest("plain")
    seed = bytes.fromhex(SPLIT["upload"]["seed"])
    _, masked_body = envelope_body(bytes.fromhex(rel["masked_sum"]), "aggregate")
    share = words(bytes.fromhex(rel["share"]))
    n = circuit.main_len

    # Execute: the key holder's share is -sum of the cohort's lane masks (one upload here), the release the
    # masked sum plus the share, decoded
    assert share == [(-m) % P for m in chacha_field(seed, SHARE_XOF, n)]
    released = decode_lanes([(y + s) % P for y, s in zip(words(masked_body), share)], f1, f2)

    # Assert: the recorded release, the honest statistics exactly; the share statement (key holder) and the
    # masked sum statement (server) are signed over what they name
    assert [float(x) for x in released] == rel["released"] == SPLIT["vector"]
    st, sm = rel["share_statement"], rel["masked_sum_statement"]
    assert ed25519_verifies(ED["keyholder"], SIG_SHARE, st)
    assert st["share_sha256"] == hashlib.sha256(bytes.fromhex(rel["share"])).hexdigest()
    assert st["manifest_sha256"] == hashlib.sha256(canon(rel["manifest"])).hexdigest()
    assert st["params_digest"] == sm["params_digest"] == digest and st["cohort"] == [HOSPITAL]
    assert ed25519_verifies(ED["server"], SIG_SUM, sm)
    assert sm["share_statement_sha256"] == hashlib.sha256(canon(st)).hexdigest()
    assert sm["masked_sum_sha256"] == hashlib.sha256(bytes.fromhex(rel["masked_sum"])).hexdigest()
    assert rel["manifest"]["aggregate_sha256"] == sm["masked_sum_sha256"]

    from secure_afl import split

    params = _params("plain")
    ours = split.verify_share(params, rel["manifest"], bytes.fromhex(rel["share"]), st, ED["keyholder"])
    split.verify_masked_sum(params, st, bytes.fromhex(rel["masked_sum"]), sm, ED["server"])
    assert [float(x) for x in split.collect(params, bytes.fromhex(rel["masked_sum"]), ours)] == rel["released"]
    assert [int(x) for x in split.lane_masks(n, [seed])] == share


# -- secagg ---------------------------------------------------------------------------------------------------
SECAGG, _ = vector_files("secagg", "round")
SECAGG_MSGS = {m["name"]: m for m in SECAGG["messages"]}
SID = SECAGG["session_id"]
ROUND_CTX = f"{SID}#round=1"  # every key, AEAD and commitment of a round binds "session#round=r"
N = SECAGG["n"]
SHAMIR_P = 2 ** 521 - 1
IDS = range(1, N + 1)
IDENTITY = {u: Ed25519PrivateKey.from_private_bytes(bytes.fromhex(SECAGG["identity_seeds"][str(u)])).public_key()
            for u in IDS}
SIG_ADVERTISEMENT = b"secure-afl/secagg/v2/key-advertisement\0"
SIG_CONSISTENCY = b"secure-afl/secagg/v2/consistency-digest\0"
SIG_DEAL = b"secure-afl/secagg/v2/deal\0"
SHARE_COMMITMENT = b"secure-afl/secagg/v2/share-commitment\0"
DEAL_CHALLENGE = b"secure-afl/secagg/v2/deal-challenge\0"
SELF_MASK, PAIR_MASK = b"saflSELFmask", b"saflPAIRmask"


def _label(text: str) -> bytes:
    """The generator's fixed secrets (tools/vectors/secagg_messages.py): SHA-256 of a label."""
    return hashlib.sha256(text.encode()).digest()


def _b64(s: str) -> bytes:
    import base64

    return base64.b64decode(s)


def _msg(name: str) -> dict:
    return json.loads(SECAGG_MSGS[name]["json"])


def _pair_key(purpose: str, private: bytes, peer_public: bytes, u: int, v: int) -> bytes:
    """s_uv = HKDF-SHA256(X25519(sk_u, pk_v), salt none, info "secure-afl/secagg/v1/" purpose/session/lo/hi)."""
    shared = X25519PrivateKey.from_private_bytes(private).exchange(X25519PublicKey.from_public_bytes(peer_public))
    info = f"secure-afl/secagg/v1/{purpose}/{ROUND_CTX}/{min(u, v)}/{max(u, v)}".encode()
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared)


def _prg(seed: bytes, domain: bytes, n: int) -> list[int]:
    """PRG(seed, domain)[i] = LE uint64 word i of ChaCha20(key = seed, counter 0, nonce = domain)."""
    enc = Cipher(algorithms.ChaCha20(seed, bytes(4) + domain), mode=None).encryptor()
    return list(struct.unpack(f"<{n}Q", enc.update(bytes(8 * n))))


def _commit(kind: str, owner: int, holder: int, share: bytes, digest: str) -> bytes:
    head = f"{ROUND_CTX}/{digest}/{kind}/{owner}->{holder}".encode()
    return hashlib.sha256(SHARE_COMMITMENT + len(head).to_bytes(2, "big") + head + share).digest()


def _deal_weights(dealer: int, commitments: list, digest: str) -> tuple[int, int]:
    """The deal's Fiat-Shamir weights (c_1, c_2): SHAKE-256 over the round, digest and dealer, then every holder's
    three commitments; 80 bytes each, reduced mod p."""
    head = f"{ROUND_CTX}/{digest}/{dealer}".encode()
    held = b"".join(int(h).to_bytes(2, "big") + cb + cs + cr for h, cb, cs, cr in commitments)
    out = hashlib.shake_256(DEAL_CHALLENGE + len(head).to_bytes(2, "big") + head + held).digest(160)
    c_1, c_2 = (int.from_bytes(out[i:i + 80], "big") % SHAMIR_P for i in (0, 80))
    return c_1, c_2


def _lagrange_at_zero(points: list[tuple[int, int]]) -> int:
    total = 0
    for i, (xi, yi) in enumerate(points):
        num = den = 1
        for j, (xj, _) in enumerate(points):
            if j != i:
                num, den = num * -xj % SHAMIR_P, den * (xi - xj) % SHAMIR_P
        total = (total + yi * num * pow(den, -1, SHAMIR_P)) % SHAMIR_P
    return total


def _parse_share(raw: bytes) -> tuple[int, int, int]:
    """Shamir share bytes: >HHB index, threshold, secret length, then the 66-byte big-endian value."""
    index, threshold, _length = struct.unpack(">HHB", raw[:5])
    return index, threshold, int.from_bytes(raw[5:], "big")


def _gen():
    from secure_afl_tools.vectors import secagg_messages

    return secagg_messages


def test_secagg_signatures_verify_under_the_recorded_identity_seeds_over_the_documented_bytes():
    # Execute and assert: each advertisement, consistency statement and deal record is signed by its sender's
    # Ed25519 identity (the recorded seed) over prefix || canonical JSON of its signed fields
    from secure_afl.secagg.messages import decode_message

    for u in IDS:
        ad = _msg(f"advertise_keys_response_{u}")
        # the stage is the wire's routing, not signed; a consistency statement signs its survivors' count and digest
        body = {k: v for k, v in ad.items() if k not in ("signature", "stage")}
        IDENTITY[u].verify(_b64(ad["signature"]), SIG_ADVERTISEMENT + canon(body))
        st = _msg(f"consistency_{u}")
        body = {k: v for k, v in st.items() if k not in ("signature", "stage", "survivors")}
        body.update(n_survivors=len(st["survivors"]),
                    survivors_sha256=hashlib.sha256(canon(sorted(st["survivors"]))).hexdigest())
        IDENTITY[u].verify(_b64(st["signature"]), SIG_CONSISTENCY + canon(body))
        deal = _msg(f"share_keys_response_{u}")["deal"]
        IDENTITY[u].verify(_b64(deal["signature"]), SIG_DEAL + canon({k: v for k, v in deal.items()
                                                                       if k != "signature"}))
        with pytest.raises(InvalidSignature):  # and not under another hospital's key
            IDENTITY[u % N + 1].verify(_b64(ad["signature"]), SIG_ADVERTISEMENT + canon(body))
        # the library accepts the same signatures
        assert decode_message(SECAGG_MSGS[f"advertise_keys_response_{u}"]["json"].encode()).verify(IDENTITY[u])
        assert decode_message(SECAGG_MSGS[f"consistency_{u}"]["json"].encode()).verify(IDENTITY[u])


def test_secagg_shares_decrypt_under_the_agreed_keys_match_their_commitments_and_reconstruct_the_secrets():
    digest = SECAGG["params_digest"]
    gen = _gen()
    enc = {u: _label(f"secagg vector enc {u}") for u in IDS}
    held: dict[int, dict[str, list]] = {u: {"b": [], "s": []} for u in IDS}
    for u in IDS:
        resp = _msg(f"share_keys_response_{u}")
        deal = resp["deal"]
        listed = [(h, _b64(cb), _b64(cs), _b64(cr)) for h, cb, cs, cr in deal["commitments"]]
        commits = {h: rest for h, *rest in listed}
        c1, c2 = _deal_weights(u, listed, digest)
        from secure_afl.secagg import masking

        assert masking.deal_challenge(SID, digest, u, listed) == (c1, c2)
        z = [int.from_bytes(_b64(c), "big") for c in deal["check"]]
        for es in resp["shares"]:
            v = es["recipient"]
            assert es["sender"] == u and v != u
            # Execute: the AEAD key from the encryption keys, the AD binding round, digest, direction, commitments
            key = _pair_key("share-enc", enc[u], X25519PrivateKey.from_private_bytes(enc[v]).public_key()
                            .public_bytes_raw(), u, v)
            ad = f"secure-afl/secagg/v2/share/{ROUND_CTX}/{digest}/{u}->{v}/".encode() + _b64(es["commit_b"]) + \
                _b64(es["commit_s"])
            plain = ChaCha20Poly1305(key).decrypt(_b64(es["nonce"]), _b64(es["ciphertext"]), ad)
            bs, ss, rs = plain[:71], plain[71:142], plain[142:]
            # Assert: each share is the one committed to, and the three lie on the published check polynomial
            assert [_commit("b", u, v, bs, digest), _commit("s", u, v, ss, digest), _commit("r", u, v, rs, digest)] \
                == commits[v] == [_b64(es["commit_b"]), _b64(es["commit_s"]), commits[v][2]]
            (ib, t, b), (_, _, s), (_, _, r) = _parse_share(bs), _parse_share(ss), _parse_share(rs)
            assert ib == v and sum(c * pow(v, k, SHAMIR_P) for k, c in enumerate(z)) % SHAMIR_P == \
                (r + c1 * b + c2 * s) % SHAMIR_P
            held[u]["b"].append((v, b))
            held[u]["s"].append((v, s))
    # any t holders' shares give the dealer's self-mask seed and mask private key
    material = json.loads(SECAGG["unmask_material"]["json"])
    for u in IDS:
        assert len(held[u]["b"]) >= t
        b = _lagrange_at_zero(held[u]["b"][:t]).to_bytes(32, "big")
        s = _lagrange_at_zero(held[u]["s"][:t]).to_bytes(32, "big")
        assert b == _label(f"secagg vector self-mask {u}") == _b64(material["self_mask_seeds"][str(u)])
        assert s == _label(f"secagg vector mask {u}")
    # the library derives the same AEAD key, AD and commitments
    from secure_afl.secagg import masking

    es = _msg("share_keys_response_1")["shares"][0]
    v = es["recipient"]
    peer = X25519PrivateKey.from_private_bytes(enc[v]).public_key().public_bytes_raw()
    lib = masking.share_key(X25519PrivateKey.from_private_bytes(enc[1]), peer, SID, 1, v)
    ad = masking.share_ad(SID, digest, 1, v, _b64(es["commit_b"]), _b64(es["commit_s"]))
    plain = lib.decrypt(_b64(es["nonce"]), _b64(es["ciphertext"]), ad)
    assert masking.share_commitment(SID, digest, "b", 1, v, plain[:71]) == _b64(es["commit_b"])
    assert gen.N == N


def _masked_words(u: int) -> list[int]:
    raw = bytes.fromhex(SECAGG_MSGS[f"masked_input_response_{u}"]["hex"])
    _, body = envelope_body(raw, "contribution")
    return words(body)


def test_secagg_masked_inputs_are_the_encoded_input_plus_the_self_mask_and_the_pairwise_masks():
    gen = _gen()
    f1, f2 = gen.params().backend_params["frac_bits"]
    mask_sk = {u: _label(f"secagg vector mask {u}") for u in IDS}
    mask_pk = {u: X25519PrivateKey.from_private_bytes(mask_sk[u]).public_key().public_bytes_raw() for u in IDS}
    for u in IDS:
        assert _b64(_msg(f"advertise_keys_response_{u}")["mask_public_key"]) == mask_pk[u]
        x = [float(v) for v in gen.vector_input(u)]
        y = [w % 2 ** 64 for w in encode_lanes_ring(x, f1, f2)]
        n = len(y)

        # Execute: y_u = enc(x_u) + PRG(b_u) + sum_{w != u} sign(u, w) PRG(s_uw) mod 2^64, sign + iff w > u,
        # s_uw from the mask keys (the complete graph: every pair)
        self_mask = _prg(_label(f"secagg vector self-mask {u}"), SELF_MASK, n)
        y = [(a + m) % 2 ** 64 for a, m in zip(y, self_mask)]
        for w in IDS:
            if w == u:
                continue
            pm = _prg(_pair_key("mask", mask_sk[u], mask_pk[w], u, w), PAIR_MASK, n)
            y = [(a + m if w > u else a - m) % 2 ** 64 for a, m in zip(y, pm)]

        # Assert: the recorded masked input's body; the library's masks are the same words
        assert _masked_words(u) == y
        from secure_afl.hazmat.prg import DOMAIN_SELF_MASK, expand
        from secure_afl.secagg import masking

        assert [int(v) for v in expand(_label(f"secagg vector self-mask {u}"), n, domain=DOMAIN_SELF_MASK)] == \
            self_mask
        w = u % N + 1
        assert masking.pair_seed(X25519PrivateKey.from_private_bytes(mask_sk[u]), mask_pk[w], SID, u, w) == \
            _pair_key("mask", mask_sk[u], mask_pk[w], u, w)


def encode_lanes_ring(vector, f1: int, f2: int) -> list[int]:
    """The two-lane fixed point as signed integers (secagg carries them mod 2^64)."""
    half = len(vector)
    p_lanes = encode_lanes(vector, f1, f2)
    return [centred(w) for w in p_lanes[:half]] + [centred(w) for w in p_lanes[half:]]


def test_secagg_aggregate_is_the_masked_sum_less_the_self_masks_decoded():
    gen = _gen()
    f1, f2 = gen.params().backend_params["frac_bits"]
    material = json.loads(SECAGG["unmask_material"]["json"])
    assert material["survivors"] == list(IDS) and material["dropped"] == []
    n = len(_masked_words(1))

    # Execute: the pairwise masks cancel over the survivors; the server removes each reconstructed self mask
    total = [sum(ws) % 2 ** 64 for ws in zip(*(_masked_words(u) for u in IDS))]
    for u in IDS:
        seed = _b64(material["self_mask_seeds"][str(u)])
        total = [(a - m) % 2 ** 64 for a, m in zip(total, _prg(seed, SELF_MASK, n))]
    signed = [a - 2 ** 64 if a >= 2 ** 63 else a for a in total]
    half = n // 2
    agg = [float(Fraction(h * 2 ** f2 + lo, 2 ** (f1 + f2))) for h, lo in zip(signed[:half], signed[half:])]

    # Assert: the recorded aggregate's SHA-256 (float64 little endian), the inputs' sum within the encoding error
    assert hashlib.sha256(struct.pack(f"<{half}d", *agg)).hexdigest() == SECAGG["aggregate_sha256"]
    want = sum(gen.vector_input(u) for u in IDS)
    assert max(abs(a - w) for a, w in zip(agg, want)) <= N * 2.0 ** -(f1 + f2)
    from secure_afl.hazmat import fixedpoint

    lib = fixedpoint.decode(np.array(total, dtype=np.uint64), (f1, f2))
    assert [float(v) for v in lib] == agg
