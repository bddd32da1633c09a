"""The hospital client role: statistics -> protect -> sign -> upload -> receipt.

Runs on: a hospital's own machine. Sees: its own embeddings and statistics,
the session parameters, the key holder's public context (ckks, accepted only
under the key holder's own signature over the parameters) and, for
secagg, its peers' public keys and the encrypted shares addressed to it.
Sends: one protected, signed contribution per session (plus, for secagg, its
public keys, encrypted shares and at most one share per peer in the unmask
round).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import numpy as np

from secure_afl.encoding import canonical_text
from secure_afl import pki
from secure_afl.session.relay import check_info
from secure_afl.session.signed import load_signed
from secure_afl.backends import get_backend
from secure_afl.params import KEYED_BACKENDS
from secure_afl.dp import add_noise_share
from secure_afl.split.sizes import noise_beside
from secure_afl.exceptions import (
    AwaitingPublication,
    BoundsExceeded,
    DuplicateContribution,
    InvalidInputError,
    InvalidParameterError,
    ParameterMismatch,
    NotFound,
    ReplayedContribution,
    RoundAlreadyClosed,
    ServerUnreachable,
    StageError,
    UnknownParty,
)
from secure_afl.keyholder_params import (
    PARAMS_SIGNATURE,
    check_published_keys,
    verify_session_params,
)
from secure_afl.packing import Layout
from secure_afl.params import SessionParams
from secure_afl.protocol import H_TAG, H_UPLOAD
from secure_afl.signing import sign_upload, verify_receipt
from secure_afl.stats import SufficientStatistics
from secure_afl.tagging import new_tag, seal_tag, sign_tag

from secure_afl.transport.tls_client import ServiceClient
from secure_afl.clients.secagg_client import run_secagg
from secure_afl.secagg.record import default_directory

__all__ = ["HospitalClient", "protect_contribution", "protect_vector"]

log = logging.getLogger("secure_afl.client")


def protect_vector(params: SessionParams, stats: SufficientStatistics, *,
                   tag: np.ndarray | None = None) -> np.ndarray:
    """C_k^r = C_k + gamma I, Q_k, n_k, counts (and the tag) packed for the session's layout.

    With DP on, this hospital's noise share (:mod:`secure_afl.dp.noise`) is added here.
    """
    lay = params.layout
    if stats.gamma != 0.0 or stats.contributors != 1.0:
        raise InvalidInputError("protect() takes one hospital's raw statistics (gamma = 0); "
                                "the session's gamma is added here")
    if stats.gram.shape != (lay.dim, lay.dim) or stats.cross.shape != (lay.dim, lay.n_classes):
        raise ParameterMismatch(f"statistics have d={stats.dim}, C={stats.n_classes}; "
                                f"the session expects {lay.layout_id}")
    if stats.n > params.bounds.n_max:
        raise InvalidInputError(f"n_k = {stats.n:.0f} exceeds the session's n_max = {params.bounds.n_max}")
    with_ri = SufficientStatistics(stats.gram + params.gamma * np.eye(lay.dim), stats.cross, stats.n,
                                   stats.class_counts, 1.0, params.gamma, tag)
    packed = Layout(lay.dim, lay.n_classes).pack(with_ri)
    # DP hook: this hospital's share of the session's noise goes in before protection (split with the Gram
    # statement draws it in its backend, which proves the statistics before it and the share's bound apart)
    return packed if noise_beside(params) else add_noise_share(params, packed)


def protect_split(party, params: SessionParams, stats: SufficientStatistics, public_context: bytes):
    """split: ``(masked payload, signed seed statement, mask seed)``; the hospital draws its seed here, so that it
    can keep it (sealed at rest) to recompute the key holder's verifier message in a dispute."""
    from secure_afl.split import RETRIES, Unlucky

    backend = get_backend(params)
    vector = protect_vector(params, stats)
    for _ in range(RETRIES):
        seed = os.urandom(32)
        try:
            payload, statement = backend.protect(vector, public_context=public_context, hospital=party.name,
                                                 identity_key=party.identity_key(), seed=seed)
            return payload, statement, seed
        except Unlucky:  # this seed's projection rows leave the honest range (probability below 2^-16)
            continue
    raise BoundsExceeded(f"{RETRIES} fresh seeds all drew projection rows outside the honest range: the vector is "
                         "not within the declared l2 bound")


def protect_contribution(party, params: SessionParams, stats: SufficientStatistics, *,
                         public_context: bytes | None = None) -> tuple[bytes, dict | None]:
    """plain / ckks / bfv: pack with the RI intermediary gamma and protect, whatever carries the upload.

    ``params`` must already carry the key holder's verified signature (HE backends). Returns
    ``(payload, tag)``: for ckks and bfv, ``tag`` is the signed statement of this upload's sealed
    aggregate tag (:mod:`secure_afl.tagging`), else None.
    """
    backend = get_backend(params)
    if params.backend not in KEYED_BACKENDS:
        return backend.protect(protect_vector(params, stats)), None
    if public_context is None:
        raise ParameterMismatch(f"a {params.backend} session needs the key holder's public context")
    if params.backend == "split":  # (masked payload, signed seed statement); the key is checked against params
        return backend.protect(protect_vector(params, stats), public_context=public_context, hospital=party.name,
                               identity_key=party.identity_key())
    check_published_keys(params, public_context)  # the signed hash, no secret key, a usable tag key
    tag = new_tag(params)
    payload = backend.protect(protect_vector(params, stats, tag=tag), public_context=public_context)
    box = seal_tag(params, party.name, tag)
    return payload, sign_tag(party.identity_key(), params, party.name, hashlib.sha256(payload).hexdigest(), box)


class HospitalClient:
    """One hospital's side of one session.

    Parameters
    ----------
    server_url : str
        ``https://127.0.0.1:8443``.
    session_id : str
    party : :class:`secure_afl.pki.PartyFiles`
        This hospital's TLS and identity material (``pki.load_party(dir, "hospital", name)``).
    server_identity_pub : Ed25519PublicKey or hex, optional
        Pins the server's receipt key; read from the PKI directory by default.
    keyholder_name : str, optional
        Which enrolled key holder signs ckks parameters (needed only when the
        PKI directory enrols more than one).
    secagg_record_dir : path, optional
        secagg: the absolute directory of the record of signed survivor sets (:mod:`secure_afl.secagg.record`);
        default ``secagg-records`` in this hospital's own directory of its PKI bundle, which the Flower
        ClientApp uses too.
    """

    def __init__(self, server_url: str, session_id: str, party, *, server_identity_pub=None,
                 receipts_dir=None, timeout: float = 120.0, keyholder_name: str | None = None,
                 secagg_record_dir=None):
        if party.role != "hospital":
            raise InvalidInputError(f"party must be a hospital, got {party.role}")
        if secagg_record_dir is not None and not Path(secagg_record_dir).is_absolute():
            raise InvalidParameterError(
                f"the secagg record directory must be an absolute path, not {str(secagg_record_dir)!r}: a relative "
                "one would be another directory for a process started elsewhere, which would then sign again")
        self.party = party
        self.name = party.name
        self.conn = ServiceClient(server_url, party, session_id, timeout=timeout)
        self.session_id = session_id
        self.keyholder_name = keyholder_name
        self.receipts_dir = Path(receipts_dir) if receipts_dir else None
        # secagg: where this hospital records the sessions whose survivor set it signed; beside its identity key
        # by default, so that any process that signs as this hospital (restarted anywhere, or its Flower
        # ClientApp) finds it
        self.secagg_record_dir = Path(secagg_record_dir) if secagg_record_dir is not None \
            else default_directory(party)
        if server_identity_pub is None:
            server_identity_pub = pki.pinned_identity(party.pki_dir, "server")
        self.server_pub = (pki.public_key_from_hex(server_identity_pub)
                           if isinstance(server_identity_pub, str) else server_identity_pub)
        self.bytes_uploaded = 0
        # what this session is comes from the operator's signed definition in our own bundle, never the server
        self.definition = load_signed(party.pki_dir, session_id)

    def close(self) -> None:
        self.conn.close()

    # -- stages -----------------------------------------------------------------------
    def fetch_params(self, *, wait_s: float | None = None) -> SessionParams:
        """The session's parameters, checked against the signed definition; a session whose key holder has not
        published yet is waited for ``wait_s`` seconds (default: the connection's ``retry_s``, which
        ``--wait-server`` sets), saying so first, then refused with :class:`AwaitingPublication`."""
        if self.name not in self.definition.hospitals:
            # the CA may have issued identities a session leaves out (spares, a withdrawn key): its roster decides
            raise UnknownParty(f"{self.name!r} is not in the signed roster of session {self.session_id!r} "
                               f"({len(self.definition.hospitals)} hospitals): the operator left it out of "
                               "`hospitals`; nothing was sent")
        wait_s = getattr(self.conn, "retry_s", 60.0) if wait_s is None else wait_s
        info = self.conn.info()
        if info["status"] == "awaiting_context":
            log.warning("session %s is waiting for the key holder's public context (`secure-afl keyholder "
                        "publish`); trying again for up to %.0f s", self.session_id, wait_s)
            try:
                info = self.conn.wait_until(lambda i: i["status"] != "awaiting_context", timeout=wait_s,
                                            what="the key holder's public context")
            except TimeoutError:
                raise AwaitingPublication(
                    f"session {self.session_id} still has no public context from the key holder after "
                    f"{wait_s:.0f} s: nothing was sent; run this command again once the key holder has run "
                    "`secure-afl keyholder publish` (or give it longer with --wait-server SECONDS)") from None
        if info["status"] in ("closed", "released"):
            raise RoundAlreadyClosed(f"session {self.session_id} is {info['status']}: it takes no more uploads")
        if info["status"] != "open":
            raise StageError(f"session {self.session_id} is {info['status']}, not open")
        params = check_info(self.definition, info)
        if info["server_identity_pub"] != pki.public_key_hex(self.server_pub):
            raise ParameterMismatch("the server does not present the pinned identity key")
        if params.backend in KEYED_BACKENDS:
            # the server relays the key holder's keys; only the key holder's own signature makes them its keys
            verify_session_params(params, info.get(PARAMS_SIGNATURE),
                                  pki.pinned_identity(self.party.pki_dir, "keyholder", self.keyholder_name))
        return params

    def protect(self, params: SessionParams, stats: SufficientStatistics) -> tuple[bytes, dict | None]:
        """plain / ckks / bfv: pack with the RI intermediary gamma and protect.

        Returns ``(payload, tag)``: for ckks and bfv, ``tag`` is the signed statement of
        this upload's sealed aggregate tag (:mod:`secure_afl.tagging`), else None.
        """
        ctx = None
        if params.backend in KEYED_BACKENDS:
            ctx = self.conn.request("GET", self.conn.path("/context"), signed=False).content
        if params.backend == "split":
            payload, statement, seed = protect_split(self.party, params, stats, ctx)
            # kept until the upload is acknowledged, then sealed beside the receipt (:meth:`dispute_paths`)
            self.__dict__.setdefault("_split_seeds", {})[hashlib.sha256(payload).hexdigest()] = seed
            return payload, statement
        return protect_contribution(self.party, params, stats, public_context=ctx)

    def protect_vector(self, params: SessionParams, stats: SufficientStatistics, *,
                       tag: np.ndarray | None = None) -> np.ndarray:
        return protect_vector(params, stats, tag=tag)

    def upload(self, params: SessionParams, payload: bytes, *, tag: dict | None = None, progress: bool = False,
               attempts: int = 3) -> dict:
        """Sign and upload ``payload``; return the verified receipt.

        If the connection drops mid-upload the server may or may not have
        committed it: ask for the receipt, and upload again (freshly signed)
        only if there is none.
        """
        sha = hashlib.sha256(payload).hexdigest()
        for attempt in range(attempts):
            statement = sign_upload(self.party.identity_key(), self.session_id, params.digest(),
                                    bytes.fromhex(sha), self.name)
            headers = {H_UPLOAD: canonical_text(statement),
                       "content-type": "application/octet-stream"}
            if tag is not None:
                headers[H_TAG] = canonical_text(tag)
            content = _progress_chunks(payload, self.name) if progress else None
            if content is not None:
                headers["content-length"] = str(len(payload))
            try:
                # no transparent retry: after a dropped connection the receipt tells whether it landed
                resp = self.conn.request("POST", self.conn.path("/uploads"), body=payload, signed=False,
                                         headers=headers, content=content, retry=False)
                receipt = resp.json()
                break
            except (ServerUnreachable, DuplicateContribution, ReplayedContribution) as e:
                receipt = self._fetch_receipt()
                if receipt is not None and receipt.get("payload_sha256") == sha:
                    break  # this very payload was accepted before the connection dropped
                if isinstance(e, (DuplicateContribution, ReplayedContribution)) or attempt == attempts - 1:
                    raise
        receipt = verify_receipt(receipt, self.server_pub)
        if receipt["payload_sha256"] != sha or receipt["hospital"] != self.name:
            raise ParameterMismatch("receipt does not acknowledge this payload")
        self.bytes_uploaded += len(payload)
        self._keep_receipt(receipt)
        if params.backend == "split":
            self._keep_upload(payload, tag, self.__dict__.get("_split_seeds", {}).pop(sha, None))
        return receipt

    def _fetch_receipt(self) -> dict | None:
        try:
            return self.conn.request("GET", self.conn.path(f"/receipts/{self.name}")).json()
        except NotFound:
            return None

    def submit(self, stats: SufficientStatistics, *, progress: bool = False, **secagg_kw) -> dict:
        """The whole hospital side in one call (all secagg stages included). Returns the receipt."""
        params = self.fetch_params()
        if params.backend == "secagg":

            return run_secagg(self, params, stats, progress=progress, **secagg_kw)
        payload, tag = self.protect(params, stats)
        return self.upload(params, payload, tag=tag, progress=progress)

    def dispute_paths(self) -> tuple[Path, Path, Path]:
        """split: where this hospital keeps its upload, its signed seed statement and its mask seed (sealed under
        its identity key, :func:`secure_afl.split.keys.seal_kept_seed`), beside its receipt, to dispute a
        refusal (:func:`secure_afl.split.roles.dispute`). Not ``*.json``: the receipts directory's JSON files
        are receipts."""
        base = self.receipts_dir / f"upload-{self.session_id}-{self.name}"
        return base.with_suffix(".payload"), base.with_suffix(".statement"), base.with_suffix(".seed")

    def kept_seed(self) -> bytes:
        """split: this hospital's mask seed of its kept upload, opened (for :func:`secure_afl.split.dispute`)."""
        from secure_afl.split import open_kept_seed

        payload_path, _, seed_path = self.dispute_paths()
        return open_kept_seed(self.party.identity_key(), self.session_id, self.name,
                              hashlib.sha256(payload_path.read_bytes()).hexdigest(), seed_path.read_bytes())

    def _keep_upload(self, payload: bytes, statement: dict | None, seed: bytes | None) -> None:
        if self.receipts_dir is None:
            return
        from secure_afl.split import seal_kept_seed

        files = [payload, json.dumps(statement, sort_keys=True).encode()]
        if seed is not None:  # an upload protected elsewhere (its seed is not this client's to keep)
            files.append(seal_kept_seed(self.party.identity_key(), self.session_id, self.name,
                                        hashlib.sha256(payload).hexdigest(), seed))
        for path, data in zip(self.dispute_paths(), files):
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)

    def _keep_receipt(self, receipt: dict) -> None:
        if self.receipts_dir is None:
            return
        self.receipts_dir.mkdir(parents=True, exist_ok=True)
        path = self.receipts_dir / f"receipt-{self.session_id}-{self.name}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(receipt, indent=2, sort_keys=True))
        os.replace(tmp, path)


def _progress_chunks(payload: bytes, name: str, chunk: int = 1 << 20):
    from tqdm import tqdm

    with tqdm(total=len(payload), unit="B", unit_scale=True, desc=f"upload {name}", leave=False) as bar:
        for i in range(0, len(payload), chunk):
            piece = payload[i:i + chunk]
            bar.update(len(piece))
            yield piece
