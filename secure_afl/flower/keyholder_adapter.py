"""The key holder's native code, seen from the Flower app: the one place that names its module.

Everything the key holder decides (manifest and upload signatures, its own
``min_clients``, the release ledger, the aggregate tag, sanity checks, RI
restoration and the solve) is :meth:`KeyHolder.reveal_and_solve`; this module
only feeds it what the ServerApp sent and writes the model and report the way
``secure-afl keyholder finalize`` writes them.
"""

from __future__ import annotations

import json
from pathlib import Path

from secure_afl.exceptions import InvalidInputError
from secure_afl.params import SessionParams
from secure_afl.server.keyholder import KeyHolder, write_model

__all__ = ["open_keyholder", "public_material", "finalize"]


def open_keyholder(node_config) -> KeyHolder:
    try:
        pki_dir, keys_dir = node_config["pki-dir"], node_config["keys-dir"]
    except KeyError as e:
        raise InvalidInputError(f"the key holder's --node-config lacks {e.args[0]}=...") from None
    passphrase = None
    if node_config.get("passphrase-file"):
        passphrase = Path(str(node_config["passphrase-file"])).read_bytes().strip()
    return KeyHolder(str(pki_dir), str(node_config.get("name", "keyholder")), str(keys_dir), passphrase=passphrase)


def public_material(kh: KeyHolder, session_id: str) -> tuple[bytes, str]:
    """The session's public context and tag public key, as ``keyholder publish`` sends them."""
    ctx, tag_pub = kh.public_path(session_id), kh._tag_paths(session_id)[1]
    if not ctx.exists() or not tag_pub.exists():
        raise InvalidInputError(f"no keys for session {session_id}: run `secure-afl keyholder keygen` first")
    return ctx.read_bytes(), tag_pub.read_text().strip()


def finalize(kh: KeyHolder, info: dict, aggregate: bytes, manifest: dict, tags: dict, *, min_clients: int,
             min_class_count: int, lam: float, out: Path, report_path: Path) -> dict:
    """The native finalize on a released aggregate; the stricter of the two policies applies."""
    params = SessionParams.from_dict(info["params"])
    res = kh.reveal_and_solve(params, aggregate, manifest,
                              min_clients=max(min_clients, int(info.get("min_clients", 1))),
                              min_class_count=max(min_class_count, int(info.get("min_class_count", 1))),
                              lam=lam, tags=tags or None)
    meta = {"session": params.session_id, "backend": params.backend, "gamma": params.gamma, "lambda": lam,
            "classes": params.layout.n_classes, "participants": res.report["participants"]}
    write_model(out, res.W, meta)
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(json.dumps(res.report, indent=2))
    return res.report
