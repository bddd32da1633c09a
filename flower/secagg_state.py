"""A hospital's SecAgg secrets between the Flower messages of one run, kept at the hospital.

A SuperNode starts a fresh ClientApp process for every message, so the
:class:`~secure_afl.secagg.SecAggClient` of one hospital (its X25519 keys, its
self-mask seed b_u, the shares it holds for its peers, the survivor set it
signed) cannot live in memory from one SecAgg stage to the next. It is carried
in two halves, neither of which leaves the hospital:

* a file (0600, in a 0700 directory of the hospital's own choosing) holding the
  state sealed in the project's one format for secrets at rest (secure_afl.hazmat.at_rest);
* the 32-byte key, in the run's ``Context.state``, which the SuperNode keeps in
  its own memory and hands only to its own ClientApp processes.

Neither half travels in a Flower message. The key is drawn at the SETUP stage,
so the file of another run (or of a crashed one) never opens: a hospital whose
SuperNode restarts mid-round is a dropout, as the protocol expects, and never
re-deals shares under secrets it might have answered differently before.

The client's state is written out attribute by attribute; what can be rebuilt
from the constructor's arguments (parameters, identity keys) or from carried
secrets (the neighbour graph from the graph seed, the share AEADs from the
X25519 key and the advertisements) is rebuilt, and an attribute this module
does not know how to carry refuses the export rather than being dropped.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from secure_afl import domains
from secure_afl.exceptions import SecureAFLError, StageError
from secure_afl.hazmat.at_rest import open_secret, seal_secret
from secure_afl.hazmat.shamir import Share
from secure_afl.params import SessionParams
from secure_afl.secagg import ConsistencyStatement, KeyAdvertisement, SecAggClient, neighbour_graph
from secure_afl.secagg.masking import raw_private, share_key

__all__ = ["export_client", "restore_client", "SealedState"]

# rebuilt from the constructor's arguments or from carried secrets, never written out
_REBUILT = frozenset({"backend", "params", "cfg", "client_id", "_identity", "_peers", "_digest", "_graph",
                      "_share_keys"})


def _encode(name: str, value):
    if name in ("_enc_sk", "_mask_sk"):
        return None if value is None else raw_private(value).hex()
    if name in ("_own_ad", "_signed"):
        return None if value is None else value.to_bytes().decode()
    if name == "_ads":
        return {str(v): ad.to_bytes().decode() for v, ad in value.items()}
    if name == "_advertised":
        return sorted(value)
    if name == "_held":
        return {str(v): [b.to_bytes().hex(), s.to_bytes().hex()] for v, (b, s) in value.items()}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    raise StageError(f"SecAggClient.{name} ({type(value).__name__}) cannot be carried between Flower messages")


def _decode(name: str, value):
    if name in ("_enc_sk", "_mask_sk"):
        return None if value is None else X25519PrivateKey.from_private_bytes(bytes.fromhex(value))
    if name == "_own_ad":
        return None if value is None else KeyAdvertisement.from_bytes(value.encode())
    if name == "_signed":
        return None if value is None else ConsistencyStatement.from_bytes(value.encode())
    if name == "_ads":
        return {int(v): KeyAdvertisement.from_bytes(ad.encode()) for v, ad in value.items()}
    if name == "_advertised":
        return frozenset(int(v) for v in value)
    if name == "_held":
        return {int(v): (Share.from_bytes(bytes.fromhex(b)), Share.from_bytes(bytes.fromhex(s)))
                for v, (b, s) in value.items()}
    if isinstance(value, dict):
        return bytes.fromhex(value["bytes"])
    return value


def export_client(client: SecAggClient) -> bytes:
    """Everything ``client`` holds that its constructor cannot rebuild, as JSON bytes (secrets included)."""
    state = {k: _encode(k, v) for k, v in sorted(vars(client).items()) if k not in _REBUILT}
    return json.dumps({"params": client.params.to_dict(), "client_id": client.client_id, "state": state},
                      sort_keys=True).encode()


def restore_client(data: bytes, identity_key, identity_keys) -> SecAggClient:
    """The client :func:`export_client` wrote, with its neighbour graph and share AEADs rebuilt."""
    d = json.loads(data)
    params = SessionParams.from_dict(d["params"])
    c = SecAggClient(params, int(d["client_id"]), identity_key, identity_keys)
    for k, v in d["state"].items():
        setattr(c, k, _decode(k, v))
    if c._graph_seed is not None:
        c._graph = neighbour_graph(c.cfg.n_parties, c.cfg.neighbours, c._graph_seed)
        c._share_keys = {v: share_key(c._enc_sk, ad.enc_public_key, params.session_id, c.client_id, v,
                                       round=c.round) for v, ad in c._ads.items()}
    return c


class SealedState:
    """One hospital's SecAgg state for one run: a sealed file here, its key in the SuperNode's context.

    Parameters
    ----------
    directory : path
        The hospital's own directory for it (created 0700; the file is 0600).
    session_id, hospital : str
        Name the file and bind the ciphertext (associated data), with ``run_id``.
    """

    def __init__(self, directory, session_id: str, hospital: str, run_id: int):
        self.dir = Path(directory)
        self.path = self.dir / f"secagg-{session_id}-{hospital}.sealed"
        self._ad = json.dumps([domains.FLOWER_SECAGG_STATE_AD, session_id, hospital, int(run_id)]).encode()

    @staticmethod
    def new_key() -> bytes:
        return secrets.token_bytes(32)

    def save(self, key: bytes, data: bytes) -> None:
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(seal_secret(data, associated_data=self._ad, key=key))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def load(self, key: bytes) -> bytes:
        try:
            blob = self.path.read_bytes()
        except FileNotFoundError:
            raise StageError(f"no SecAgg state at {self.path}: this hospital did not take part in the setup "
                             "of this run") from None
        try:
            return open_secret(blob, associated_data=self._ad, key=key)
        except (SecureAFLError, ValueError):
            raise StageError(f"{self.path} is not this run's SecAgg state") from None

    def erase(self) -> None:
        self.path.unlink(missing_ok=True)
