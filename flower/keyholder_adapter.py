"""The key holder's native code, seen from the Flower app: the one place that names its module.

Everything the key holder decides (manifest and upload signatures, its own
``min_clients``, the re-sum of the signed uploads and the single flooded
decryption for HE sessions, the release ledger, the aggregate tag, sanity
checks, RI restoration and the solve) is :meth:`KeyHolder.release_he` (ckks,
bfv), :meth:`KeyHolder.release_split`, :meth:`KeyHolder.take_commitment` and :meth:`KeyHolder.release_kept` (split:
its share statement, from the seed statements alone; the server's committed masked sum over its cohort, kept before
the share leaves; the release from that kept sum) or
:meth:`KeyHolder.reveal_and_solve` (plain, secagg); this module only feeds it
what the ServerApp sent and writes the model and report the way
``secure-afl keyholder finalize`` writes them.
"""

from __future__ import annotations

import json
from pathlib import Path

from secure_afl.exceptions import InvalidInputError
from secure_afl.backends import HE_BACKENDS
from secure_afl.keyholder import KeyHolder, write_model
from secure_afl.model_file import model_metadata
from secure_afl.session.relay import check_same
from secure_afl.session.signed import load_signed
from secure_afl.cohort import release_policy

__all__ = ["open_keyholder", "publication", "countersign", "finalize", "split_share", "split_commit", "split_result"]


def open_keyholder(node_config) -> KeyHolder:
    try:
        pki_dir, keys_dir = node_config["pki-dir"], node_config["keys-dir"]
    except KeyError as e:
        raise InvalidInputError(f"the key holder's --node-config lacks {e.args[0]}=...") from None
    passphrase = None
    if node_config.get("passphrase-file"):
        passphrase = Path(str(node_config["passphrase-file"])).read_bytes().strip()
    return KeyHolder(str(pki_dir), str(node_config.get("name", "keyholder")), str(keys_dir), passphrase=passphrase)


def publication(kh: KeyHolder, session_id: str) -> bytes:
    """The body ``keyholder publish`` sends: public context, tag key, signature over the parameters."""
    if not kh.public_path(session_id).exists():
        raise InvalidInputError(f"no keys for session {session_id}: run `secure-afl keyholder keygen` first")
    kh.check_unlock(session_id)  # a wrong passphrase is refused before hospitals encrypt to the key
    return kh.publication_body(session_id)


def countersign(kh: KeyHolder, close: dict, manifest: dict) -> dict:
    """The key holder's countersignature over the server's close record (:meth:`KeyHolder.countersign_close`)."""
    cs = kh.countersign_close(close, manifest)
    kh.keep_audit_head(str(close.get("session_id")), close, cs)
    return cs


class _MessageSource:
    """What the ServerApp sent: the manifest, the stored uploads and the tag statements."""

    def __init__(self, manifest: dict, contributions: dict, tags: dict, verifier=None):
        self._manifest, self._contributions, self._tags = manifest, contributions, tags
        self._verifier = verifier

    def manifest(self) -> dict:
        return self._manifest

    def contribution(self, hospital: str) -> bytes:
        if hospital not in self._contributions:
            raise InvalidInputError(f"the ServerApp sent no upload for {hospital[:64]!r}")
        return self._contributions[hospital]

    def tags(self) -> dict:
        return self._tags

    def split_queries(self, queries: dict):
        """The server's signed verifier messages as sent, formed at the query seeds this key holder answered
        before (checked by :meth:`KeyHolder.release_split` against the seeds it derives, as over HTTP)."""
        return self._verifier


def split_queries(kh: KeyHolder, info: dict, tags: dict) -> dict:
    """split: hospital -> {payload_sha256, query_seed} for each upload whose signed seed statement holds."""
    return kh.split_queries(str(info.get("session_id")), tags)


def finalize(kh: KeyHolder, info: dict, aggregate: bytes, manifest: dict, tags: dict, contributions: dict, *,
             min_clients: int, min_class_count: int, lam: float, out: Path, report_path: Path,
             unmask: dict | None = None) -> dict:
    """The native finalize; the stricter of the two policies applies. HE sessions are re-summed from
    the signed uploads (``contributions``); the server's ``aggregate`` is used for plain and secagg
    (with the server's ``unmask`` material, as ``keyholder finalize`` fetches it)."""

    definition = load_signed(kh.pki_dir, str(info.get("session_id")))
    rp = release_policy(definition, min_clients=min_clients, min_class_count=min_class_count)
    policy = {"min_clients": rp.min_clients, "min_class_count": rp.min_class_count, "lam": lam}
    if definition.backend in HE_BACKENDS:
        res = kh.release_he(definition.session_id, _MessageSource(manifest, contributions, tags), **policy)
    else:
        params = definition.session_params()
        check_same(params.to_dict(), info.get("params") or {}, what="params.", source="the ServerApp")
        res = kh.reveal_and_solve(params, aggregate, manifest, unmask=unmask, **policy)
    write_model(out, res.W, model_metadata(res.params, res.report, lam))
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(json.dumps(res.report, indent=2))
    return res.report


def split_share(kh: KeyHolder, info: dict, manifest: dict, tags: dict, verifier, *, min_clients: int) -> dict:
    """split: :meth:`KeyHolder.release_split` over what the ServerApp sent (the manifest, the hospitals'
    signed seed statements and the server's signed verifier messages; never a masked vector): the same
    validity decision and refusals by name as over HTTP. The share is kept here; its signed statement, returned,
    is all that goes to the ServerApp before the server has committed to its masked sum."""
    definition = load_signed(kh.pki_dir, str(info.get("session_id")))
    if definition.backend != "split":
        raise InvalidInputError(f"session {definition.session_id} runs {definition.backend}, not split")
    rp = release_policy(definition, min_clients=min_clients)
    body, statement = kh.release_split(definition.session_id, _MessageSource(manifest, {}, tags, verifier),
                                       min_clients=rp.min_clients)
    kh.keep_split_share(definition.session_id, body, statement)
    return statement


def split_commit(kh: KeyHolder, info: dict, manifest: dict, commitment) -> bytes:
    """split: the server's signed masked sum relayed by the ServerApp, checked against this key holder's own
    kept share statement and kept (:meth:`KeyHolder.take_commitment`) -> the share, which only now leaves."""
    return kh.take_commitment(str(info.get("session_id")), manifest, commitment)


def split_result(kh: KeyHolder, info: dict, *, lam: float, min_class_count: int, out: Path,
                 report_path: Path) -> dict:
    """split: the release this key holder forms from the masked sum it kept before its share left and its share
    (:meth:`KeyHolder.release_kept`), written as ``keyholder finalize`` writes it; nothing the ServerApp sends
    now enters it."""
    definition = load_signed(kh.pki_dir, str(info.get("session_id")))
    rp = release_policy(definition, min_class_count=min_class_count)
    res = kh.release_kept(definition.session_id, lam=lam, min_class_count=rp.min_class_count)
    write_model(out, res.W, model_metadata(res.params, res.report, lam))
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(json.dumps(res.report, indent=2))
    return res.report
