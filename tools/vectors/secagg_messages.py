"""vectors/secagg/: one real secagg round's messages, byte for byte, and its bad cases.

    python -m secure_afl_tools.vectors secagg           # rewrite vectors/secagg/
    python -m secure_afl_tools.vectors secagg --check   # exit 1 if regenerating changes a byte

One instance, vectors/secagg/round.json (every message of the round in wire order, the complaint and the
unmask material), and one file per bad case beside it, vectors/secagg/bad_<case>.json (the layout:
:mod:`secure_afl_tools.vectors.files`).

Everything is fixed: the hospitals' Ed25519 identity keys, their X25519 key pairs and self-mask seeds come
from SHA-256 of a label, and the protocol's own randomness (Shamir coefficients, share nonces) is drawn
from a SHA-256 counter stream that replaces :mod:`secrets` in the two modules that draw it, for the length
of one run only. Every message comes out of the real client and server round (secure_afl.secagg), so the
files pin the wire format: tests/test_vector_files.py regenerates them and compares the bytes, and
tests/test_secagg_vectors.py replays each bad case against the real decoder, the real server round or a real
client.
"""

from __future__ import annotations

import base64
import hashlib
import json
from contextlib import contextmanager

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from secure_afl.encoding import canonical_json
from secure_afl.hazmat import shamir
from secure_afl.packing import Layout
from secure_afl.params import Bounds
from secure_afl.secagg import client as client_module
from secure_afl.secagg.client import SecAggClient
from secure_afl.secagg.messages import DealerComplaint
from secure_afl.secagg.server import SecAggServerRound
from secure_afl.secagg.settings import Stage, secagg_session_params
from secure_afl_tools.vectors import files as vector_files

#: the folder of vectors/ this generator writes, every file in it
OWNS = "secagg"
#: the files' format (files.VERSIONS); a file of another version is refused by name
VERSION = vector_files.VERSIONS[OWNS]
INSTANCE = "round"
SESSION = "vector-session"
N = 3
LAYOUT = Layout(2, 2)
BOUNDS = Bounds(1.0, 100, 20)


def _label(label: str) -> bytes:
    return hashlib.sha256(label.encode("ascii")).digest()


def identity_seed(u: int) -> bytes:
    return _label(f"secagg vector identity {u}")


def params():
    return secagg_session_params(SESSION, LAYOUT, 1.0, BOUNDS, n_parties=N)


def identities():
    priv = {u: Ed25519PrivateKey.from_private_bytes(identity_seed(u)) for u in range(1, N + 1)}
    return priv, {u: k.public_key() for u, k in priv.items()}


def make_client(p, u: int, priv, pub, *, round: int = 1) -> SecAggClient:
    return SecAggClient._from_parts(p, u, priv[u], pub, enc_private=_label(f"secagg vector enc {u}"),
                                    mask_private=_label(f"secagg vector mask {u}"),
                                    self_mask_seed=_label(f"secagg vector self-mask {u}"), round=round)


def vector_input(u: int) -> np.ndarray:
    return np.linspace(-1.0, 1.0, LAYOUT.length) * u / 4


class _Stream:
    """``secrets``' two calls the protocol makes, from SHA-256(seed || counter): fixed output, nothing else."""

    def __init__(self, seed: bytes):
        self._seed, self._n = seed, 0

    def token_bytes(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            out += hashlib.sha256(self._seed + self._n.to_bytes(8, "big")).digest()
            self._n += 1
        return out[:n]

    def randbelow(self, bound: int) -> int:
        nbytes = (bound.bit_length() + 7) // 8 + 16  # 128 extra bits: the bias is below 2^-128
        return int.from_bytes(self.token_bytes(nbytes), "big") % bound


@contextmanager
def fixed_randomness(seed: bytes):
    saved = client_module.secrets, shamir.secrets
    client_module.secrets = shamir.secrets = _Stream(seed)
    try:
        yield
    finally:
        client_module.secrets, shamir.secrets = saved


def run_round():
    """One complete round of N hospitals through bytes; returns [(name, stage, message)] in wire order."""
    p = params()
    priv, pub = identities()
    clients = {u: make_client(p, u, priv, pub) for u in range(1, N + 1)}
    server = SecAggServerRound(p, participants=range(1, N + 1), identity_keys=pub)
    out = []
    with fixed_randomness(_label("secagg vector protocol randomness")):
        for stage in Stage.all():
            if stage == Stage.UNMASK:
                for u in sorted(server.active):
                    st = clients[u].sign_survivors(server.survivors_)
                    out.append((f"consistency_{u}", stage, st))
                    server.receive(st)
            for u in sorted(server.active):
                req = server.request(u)
                resp = (clients[u].masked_input(req, vector_input(u)) if stage == Stage.MASKED_INPUT
                        else clients[u].handle(req))
                out += [(f"{stage}_request_{u}", stage, req), (f"{stage}_response_{u}", stage, resp)]
                server.receive(resp)
            server.close_stage()
    # a complaint client 1 could file against dealer 2 (its shares are fixed values here, so it proves nothing:
    # the server refuses it, see the negative cases) and the material the server reconstructed
    deal = next(m for name, _, m in out if name == "share_keys_response_2").deal
    t = p.backend_params["threshold"]
    shares = [shamir.Share(1, int.from_bytes(_label(f"secagg vector complaint {k}"), "big"), t, 32).to_bytes()
              for k in "bsr"]
    out.append(("dealer_complaint_1", Stage.MASKED_INPUT, DealerComplaint(SESSION, 1, deal, *shares)))
    return out, server.aggregate_vector_, server.unmask_material()


def _wire(msg) -> dict:
    raw = msg.to_bytes()
    if raw[:1] == b"{":
        return {"json": raw.decode("ascii")}
    return {"hex": raw.hex()}


def _flip_signature(wire: str, index: int = 0) -> str:
    d = json.loads(wire)
    sig = bytearray(base64.b64decode(d["signature"]))
    sig[index] ^= 1
    d["signature"] = base64.b64encode(bytes(sig)).decode("ascii")
    return json.dumps(d, sort_keys=True, separators=(",", ":"))


def _edit(wire: str, **changes) -> str:
    d = json.loads(wire)
    d.update(changes)
    return json.dumps(d, sort_keys=True, separators=(",", ":"))


def _negative(by_name: dict) -> list[dict]:
    ad = by_name["advertise_keys_response_1"]["json"]
    skr = by_name["share_keys_request_1"]["json"]
    st = by_name["consistency_2"]["json"]
    masked = by_name["masked_input_response_1"]["hex"]
    d = json.loads(skr)
    tampered_ads = [list(a) for a in d["advertisements"]]
    sig = bytearray(base64.b64decode(tampered_ads[1][3]))
    sig[5] ^= 0x80
    tampered_ads[1][3] = base64.b64encode(bytes(sig)).decode("ascii")
    short_key = json.loads(ad)
    short_key["enc_public_key"] = base64.b64encode(bytes(31)).decode("ascii")
    # "replaces": the recorded message the case stands in for; the replay feeds every recorded message
    # before it to a fresh server round ("server") or a fresh fixed client ("client"), then the case
    return [
        {"name": "key_advertisement_tampered_signature", "json": _flip_signature(ad), "replay": "server",
         "replaces": "advertise_keys_response_1", "expect": "InvalidContribution",
         "mutation": "hospital 1's key advertisement with one bit of its signature flipped"},
        {"name": "consistency_tampered_signature", "json": _flip_signature(st, 63), "replay": "server",
         "replaces": "consistency_2", "expect": "InvalidContribution",
         "mutation": "hospital 2's signed survivor list with one bit of its signature's last byte flipped"},
        {"name": "consistency_other_session", "json": _edit(st, session_id="another-session"), "replay": "server",
         "replaces": "consistency_2", "expect": "WrongSession",
         "mutation": "hospital 2's signed survivor list naming another session"},
        {"name": "share_keys_request_tampered_advertisement", "json": _edit(skr, advertisements=tampered_ads),
         "replay": "client", "replaces": "share_keys_request_1", "expect": "InvalidContribution",
         "mutation": "the server's share-keys request to hospital 1 forwarding hospital 2's advertisement with "
                     "one bit of its signature flipped"},
        {"name": "share_keys_request_other_session", "json": _edit(skr, session_id="another-session"),
         "replay": "client", "replaces": "share_keys_request_1", "expect": "WrongSession",
         "mutation": "the server's share-keys request to hospital 1 naming another session"},
        {"name": "share_keys_request_other_round", "json": _edit(skr, round=2), "replay": "client",
         "replaces": "share_keys_request_1", "expect": "StaleRound",
         "mutation": "the server's share-keys request to hospital 1 naming round 2 in round 1"},
        {"name": "key_advertisement_round_zero", "json": _edit(ad, round=0), "replay": "decode",
         "expect": "MalformedPayload", "mutation": "hospital 1's key advertisement naming round 0"},
        {"name": "key_advertisement_round_past_16_bits", "json": _edit(ad, round=0x10000), "replay": "decode",
         "expect": "MalformedPayload", "mutation": "hospital 1's key advertisement naming round 2^16"},
        {"name": "key_advertisement_short_public_key",
         "json": json.dumps(short_key, sort_keys=True, separators=(",", ":")), "replay": "decode",
         "expect": "MalformedPayload", "mutation": "hospital 1's key advertisement with a 31-byte public key"},
        {"name": "share_keys_request_truncated", "json": skr[:len(skr) // 2], "replay": "decode",
         "expect": "MalformedPayload", "mutation": "the first half of the share-keys request to hospital 1"},
        {"name": "masked_input_truncated", "hex": masked[:len(masked) // 2], "replay": "decode",
         "expect": "MalformedPayload", "mutation": "the first half of hospital 1's sealed masked input"},
    ]


def build() -> dict[str, dict]:
    """The files by name: the round, then each bad case (naming the round it mutates)."""
    messages, total, material = run_round()
    wire = [{"name": name, "stage": stage, "type": m.TYPE, **_wire(m)} for name, stage, m in messages]
    complaint = wire.pop()
    by_name = {w["name"]: w for w in wire}
    bad = _negative(by_name) + [
        {"name": "dealer_complaint_proving_nothing", "json": complaint["json"], "replay": "server",
         "replaces": "masked_input_response_1", "expect": "InvalidContribution",
         "mutation": "hospital 1's complaint against dealer 2 with shares that are fixed values, not the ones "
                     "dealt, in place of its masked input"}]
    head = {"version": VERSION, "protocol": OWNS}
    round_ = {
        **head,
        "instance": INSTANCE,
        "description": "One secagg round of 3 hospitals (session 'vector-session', Layout(2, 2), the complete "
                       "graph) as the real client and server produce it, each message's exact wire bytes "
                       "(canonical JSON, or the sealed envelope in hex for a masked input); its bad cases, each "
                       "a file naming the typed exception it must raise, are listed in bad_cases. Regenerate with "
                       "`python -m secure_afl_tools.vectors secagg`; see the generator for how every key and random "
                       "draw is fixed.",
        "session_id": SESSION,
        "n": N,
        "identity_seeds": {str(u): identity_seed(u).hex() for u in range(1, N + 1)},
        "params_digest": params().digest().hex(),
        "aggregate_sha256": hashlib.sha256(np.ascontiguousarray(total, dtype="<f8").tobytes()).hexdigest(),
        "messages": wire,
        "dealer_complaint": complaint,
        "unmask_material": {"json": canonical_json(material.to_dict()).decode("ascii")},
        "bad_cases": [c["name"] for c in bad],
    }
    return {INSTANCE: round_, **{f"{vector_files.BAD}{c['name']}": {**head, "instance": INSTANCE, **c} for c in bad}}


def files(root=vector_files.ROOT) -> dict[str, str]:
    """``{path under vectors/: text}``: every file this generator writes (nothing is recorded: ``root`` is
    unused, every draw is fixed)."""
    return {f"{OWNS}/{name}.json": vector_files.render(d) for name, d in build().items()}
