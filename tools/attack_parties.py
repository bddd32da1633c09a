"""The parties the attack commands impersonate: a hospital's signed upload and a malicious server that
answers the key holder with whatever the attack chooses."""

from __future__ import annotations

import hashlib

import numpy as np
from secure_afl.audit_log import make_close_record
from secure_afl.encoding import canonical_json
from secure_afl.packing import Layout
from secure_afl.signing import MANIFEST_PREFIX
from secure_afl.signing import sign_upload
from secure_afl.tagging import new_tag, seal_tag, sign_tag
from secure_afl.server import closing, split_round

__all__ = ["tagged_upload", "signed_participant", "MaliciousServer", "ForgingSplitSource", "forge_verifier",
           "subset_manifest"]


def tagged_upload(party, params, backend, public, vector):
    """What an honest ckks hospital sends: the payload (tag inside) and the signed, sealed tag."""

    lay = Layout(params.layout.dim, params.layout.n_classes)
    tag = new_tag(params)
    v = vector.copy()
    v[lay.slices["tag"]] = tag
    payload = backend.protect(v, public_context=public)
    statement = sign_tag(party.identity_key(), params, party.name, hashlib.sha256(payload).hexdigest(),
                         seal_tag(params, party.name, tag))
    return payload, statement


def signed_participant(party, params, payload: bytes) -> dict:
    from secure_afl import pki

    st = sign_upload(party.identity_key(), params.session_id, params.digest(), hashlib.sha256(payload).digest(),
                     party.name)
    return {**st, "identity_pub": pki.public_key_hex(party.identity_pub())}


class _Answer:
    def __init__(self, value):
        self._v = value

    @property
    def content(self) -> bytes:
        return self._v

    def json(self):
        return self._v


class MaliciousServer:
    """The server as the adversary: it answers the key holder's real finalize with what it chooses.

    It holds what a real server holds (the hospitals' signed uploads and tags,
    its own signing key, the public context) and nothing else.
    """

    def __init__(self, server_party, params, manifest_parts, payloads: dict, tags: dict, *, min_clients: int,
                 aggregate: bytes = b""):
        import time



        self.session_id = params.session_id
        self._params, self._payloads, self._tags, self._aggregate = params, payloads, tags, aggregate
        # the server signs whatever list it likes (no honest-server check); it cannot sign for a hospital
        keep = ("hospital", "payload_sha256", "nonce", "time", "signature", "identity_pub")
        st = {"type": "manifest", "v": 1, "session_id": params.session_id, "params_digest": params.digest().hex(),
              "aggregate_sha256": hashlib.sha256(aggregate).hexdigest(), "min_clients": min_clients,
              "participants": sorted(({k: p[k] for k in keep} for p in manifest_parts), key=lambda e: e["hospital"]),
              "time": int(time.time())}
        sig = server_party.identity_key().sign(MANIFEST_PREFIX + canonical_json(st)).hex()
        self._manifest = {**st, "signature": sig}
        self._min_clients = min_clients
        # it can also sign a close record for the release it presents (the key holder countersigns that)

        self._close = make_close_record(server_party.identity_key(), params.session_id, 1, "0" * 64,
                                        [p["hospital"] for p in st["participants"]])

    def path(self, suffix: str = "") -> str:
        return suffix

    def info(self) -> dict:
        return {"status": "released", "backend": "ckks", "params": self._params.to_dict(),
                "params_digest": self._params.digest().hex(), "min_clients": self._min_clients,
                "min_class_count": 1}

    def status(self) -> dict:
        """The key holder's signed status view: the round closed over the uploads it serves."""
        return {"status": "released", "uploaded": sorted(self._payloads)}

    def request(self, method: str, path: str, *, body: bytes = b""):
        if path == "/manifest":
            return _Answer(self._manifest)
        if path == "/tags":
            return _Answer(self._tags)
        if path == "/aggregate":
            return _Answer(self._aggregate)
        if path.startswith("/contributions/"):
            return _Answer(self._payloads[path.rsplit("/", 1)[1]])
        if path == "/audit/head":
            return _Answer({"close": self._close})
        if path == "/audit/countersign":
            return _Answer({"stored": True})
        raise AssertionError(f"unexpected request {method} {path}")


def forge_verifier(params, statement: dict, server_key) -> dict:
    """The server's verifier message for one upload with one word changed, re-signed with the server's key:
    the key holder's joint check then fails on an honest upload."""
    from secure_afl import split
    from secure_afl.hazmat.fields import small
    from secure_afl.split.sizes import field_of

    F = field_of(params)
    msg = F.from_bytes(bytes.fromhex(statement["message"]))
    bump = np.zeros(len(msg), dtype=np.uint64)
    bump[0] = 1
    return split.sign_verifier_message(params, statement["hospital"], statement["payload_sha256"],
                                      bytes.fromhex(statement["query_seed"]), F.add(msg, small(F, bump)), server_key)


def subset_manifest(manifest: dict, keep, server_key) -> dict:
    """The server's manifest re-signed over the uploads of ``keep`` only (the attack of choosing the cohort)."""
    from secure_afl.signing import MANIFEST_PREFIX, canonical_json

    st = {k: v for k, v in manifest.items() if k != "signature"}
    st = {**st, "min_clients": 1, "participants": [e for e in st["participants"] if e["hospital"] in set(keep)]}
    return {**st, "signature": server_key.sign(MANIFEST_PREFIX + canonical_json(st)).hex()}


class ForgingSplitSource:
    """What a malicious split server hands the key holder: its stored manifest (or one of its choosing), the
    hospitals' seed statements, and its verifier messages with those of ``forge`` falsified and re-signed."""

    def __init__(self, srv, server_key, *, manifest=None, forge=()):
        self._srv, self._key, self._manifest, self._forge = srv, server_key, manifest, set(forge)

    def manifest(self) -> dict:
        return self._manifest if self._manifest is not None else closing.released(self._srv)[1]

    def tags(self) -> dict:
        return closing.tags(self._srv)

    def split_queries(self, queries: dict) -> dict:
        """The server's answers to the key holder's query seeds (``POST /split/queries``), those of ``forge``
        falsified and re-signed."""
        from secure_afl.encoding import canonical_json

        out = dict(split_round.form_verifier_messages(self._srv, "keyholder:keyholder", canonical_json(queries)))
        for h in self._forge & set(out):
            out[h] = forge_verifier(self._srv.params, out[h], self._key)
        return out
