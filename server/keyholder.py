"""The key holder role: keys, release checks, decryption of the aggregate only, the solve.

Runs on: a machine of a party that does not collude with the server. Sees:
the CKKS secret key (ckks), the server-signed manifest, and the revealed
aggregate of at least ``min_clients`` hospitals: never one hospital's
statistics. Produces the model W and a verification report.

Stages (``secure-afl keyholder ...``):

1. ``keygen``   fresh asymmetric CKKS context for one session; the secret
                context is stored encrypted at rest (0600), the public one
                (no secret, relinearisation or Galois keys) is written beside it;
2. ``publish``  sends the public context to the server, which opens the session;
3. ``finalize`` closes the round, fetches aggregate + manifest, verifies the
                manifest, decrypts the aggregate, sanity-checks it, enforces
                the release policy, applies RI restoration, solves and writes
                the model (safetensors) and a report.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from secure_afl import pki
from secure_afl._io import check_passphrase, read_private_file, refuse_if_shared
from secure_afl.analytic import solve_from_sums
from secure_afl.backends import get_backend
from secure_afl.exceptions import DecryptionRefused, InvalidInputError, SecureAFLError
from secure_afl.packing import Layout
from secure_afl.params import SessionParams
from secure_afl.release import ReleaseLedger, check_aggregate_against_manifest, check_class_minimum, sanity_check

__all__ = ["KeyHolder", "FinalResult", "write_model", "read_model", "register"]

log = logging.getLogger("secure_afl.keyholder")
PASSPHRASE_ENV = "SECURE_AFL_KEY_PASSPHRASE"


@dataclass
class FinalResult:
    W: np.ndarray
    stats: object
    params: SessionParams
    manifest: dict
    report: dict


def write_model(path, W: np.ndarray, metadata: dict) -> None:
    """safetensors file: tensor "W" (d, C) float64 plus string metadata; atomic."""
    from safetensors.numpy import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    meta = {k: v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()}
    save_file({"W": np.ascontiguousarray(W, dtype=np.float64)}, str(tmp), metadata=meta)
    os.replace(tmp, path)


def read_model(path) -> tuple[np.ndarray, dict]:
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        return f.get_tensor("W"), dict(f.metadata() or {})


class KeyHolder:
    """Key custody and release for one consortium key holder identity.

    Parameters
    ----------
    pki_dir : path
        Consortium PKI directory (CA, this key holder's files, enrolments).
    name : str
        This key holder's enrolled name.
    keys_dir : path
        Where per-session key files and the release ledger live (0700).
    passphrase : bytes, optional
        Protects the secret contexts at rest; default: $SECURE_AFL_KEY_PASSPHRASE.
    """

    def __init__(self, pki_dir, name: str, keys_dir, *, passphrase: bytes | None = None):
        self.pki_dir = Path(pki_dir)
        self.party = pki.load_party(pki_dir, "keyholder", name)
        self.keys_dir = Path(keys_dir)
        self.keys_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if passphrase is None and os.environ.get(PASSPHRASE_ENV):
            passphrase = os.environ[PASSPHRASE_ENV].encode()
        self.passphrase = None if passphrase is None else check_passphrase(passphrase)

    # -- key files ----------------------------------------------------------------------
    def _secret_path(self, session_id: str) -> Path:
        return self.keys_dir / f"{session_id}.secret.enc"

    def public_path(self, session_id: str) -> Path:
        return self.keys_dir / f"{session_id}.public.ctx"

    def _tag_paths(self, session_id: str) -> tuple[Path, Path]:
        return self.keys_dir / f"{session_id}.tag.enc", self.keys_dir / f"{session_id}.tag.pub"

    def keygen(self, params: SessionParams) -> bytes:
        """Fresh CKKS keys for this session; returns the public context bytes."""
        from secure_afl.backends.ckks import generate_keys, save_secret_context
        from secure_afl.tagging import generate_tag_key

        if self.passphrase is None:
            raise InvalidInputError(f"a passphrase is needed to store the secret key at rest: set {PASSPHRASE_ENV}")
        if self._secret_path(params.session_id).exists():
            raise InvalidInputError(f"keys for session {params.session_id} already exist; a session's key is "
                                    "never regenerated (start a new session for a new key)")
        keys = generate_keys(params)
        public = keys.public_context
        save_secret_context(self._secret_path(params.session_id), keys.secret_context,
                            passphrase=self.passphrase, session_id=params.session_id)
        tag_secret, tag_public = generate_tag_key()
        tag_enc, tag_pub = self._tag_paths(params.session_id)
        save_secret_context(tag_enc, tag_secret, passphrase=self.passphrase, session_id=f"{params.session_id}/tag")
        for path, data in ((tag_pub, tag_public.encode()), (self.public_path(params.session_id), public)):
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        return public

    def _secret(self, session_id: str) -> bytes:
        from secure_afl.backends.ckks import load_secret_context

        refuse_if_shared(self._secret_path(session_id), "sealed secret context")
        return load_secret_context(self._secret_path(session_id), passphrase=self.passphrase,
                                   session_id=session_id)

    def _tag_secret(self, session_id: str) -> bytes:
        from secure_afl.backends.ckks import load_secret_context

        refuse_if_shared(self._tag_paths(session_id)[0], "sealed tag key")
        return load_secret_context(self._tag_paths(session_id)[0], passphrase=self.passphrase,
                                   session_id=f"{session_id}/tag")

    # -- online stages ----------------------------------------------------------------------
    def connect(self, server_url: str, session_id: str):
        from secure_afl.clients.transport import ServiceClient

        return ServiceClient(server_url, self.party, session_id)

    def publish(self, conn) -> dict:
        """Send the public context and the tag public key; the server opens the session."""
        from secure_afl.protocol import context_publication

        body = context_publication(self.public_path(conn.session_id).read_bytes(),
                                   self._tag_paths(conn.session_id)[1].read_text().strip())
        return conn.request("POST", conn.path("/context"), body=body).json()

    def close_round(self, conn) -> dict:
        return conn.request("POST", conn.path("/close")).json()

    def finalize(self, conn, *, min_clients: int, lam: float = 0.0, min_class_count: int = 1,
                 expected_hospitals: list[str] | None = None) -> FinalResult:
        """Close (if needed), fetch, verify, reveal, check, restore and solve.

        The release policy is the stricter of this key holder's and the session's
        (``min_clients``, ``min_class_count``): the server cannot relax it.
        """
        info = conn.info()
        min_clients = max(min_clients, int(info.get("min_clients", 1)))
        min_class_count = max(min_class_count, int(info.get("min_class_count", 1)))
        if info["status"] != "released":
            self.close_round(conn)
            info = conn.info()
        params = SessionParams.from_dict(info["params"])
        aggregate = conn.request("GET", conn.path("/aggregate")).content
        manifest = conn.request("GET", conn.path("/manifest")).json()
        self.countersign_audit_head(conn, manifest)
        unmask = tags = None
        if params.backend == "secagg":
            unmask = conn.request("GET", conn.path("/secagg/unmask-material")).json()
        if params.backend == "ckks":
            tags = conn.request("GET", conn.path("/tags")).json()
        return self.reveal_and_solve(params, aggregate, manifest, min_clients=min_clients, lam=lam,
                                     min_class_count=min_class_count, expected_hospitals=expected_hospitals,
                                     unmask=unmask, tags=tags)

    def countersign_audit_head(self, conn, manifest: dict) -> dict:
        """Countersign the server's close record (audit seq + head of this release) and hand it back."""
        from secure_afl.audit import countersign_head
        from secure_afl.signing import canonical_json

        servers = pki.load_enrolments(self.pki_dir, role="server")
        close = conn.request("GET", conn.path("/audit/head")).json()["close"]
        try:
            cs = countersign_head(self.party.identity_key(), self.party.name, close,
                                  next(iter(servers.values())).public_key(), manifest)
        except (SecureAFLError, StopIteration) as e:
            raise DecryptionRefused(f"not decrypting: the audit close record does not hold ({e})") from e
        return conn.request("POST", conn.path("/audit/countersign"), body=canonical_json(cs)).json()

    def reveal_and_solve(self, params: SessionParams, aggregate: bytes, manifest: dict, *, min_clients: int,
                         lam: float = 0.0, min_class_count: int = 1,
                         expected_hospitals: list[str] | None = None, unmask: dict | None = None,
                         tags: dict | None = None) -> FinalResult:
        """Verify, reveal, check and solve one released aggregate.

        For ckks, ``tags`` maps each participant to its signed aggregate-tag
        statement; the decrypted tag slots must equal the sum of the sealed tags
        (:mod:`secure_afl.tagging`), or the release is refused and the key blocked.

        For secagg, ``unmask`` is the server's reconstructed material (survivors'
        self-mask seeds, dropped hospitals' mask keys); the key holder removes the
        masks itself from the masked sum the manifest names, so a wrong material
        yields garbage that the sanity checks refuse, never a silently wrong model.
        """
        servers = pki.load_enrolments(self.pki_dir, role="server")
        if len(servers) != 1:
            raise DecryptionRefused("exactly one enrolled server identity is required to check the manifest")
        server_pub = next(iter(servers.values())).public_key()
        enrolled = pki.enrolled_keys(pki.load_enrolments(self.pki_dir, role="hospital"))
        if expected_hospitals is not None:
            enrolled = {k: v for k, v in enrolled.items() if k in set(expected_hospitals)}
        try:
            m = check_aggregate_against_manifest(params, aggregate, manifest, server_pub, enrolled, min_clients)
        except SecureAFLError as e:
            raise DecryptionRefused(f"not decrypting: {e}") from e
        participants = sorted(p["hospital"] for p in m["participants"])
        agg_sha = hashlib.sha256(aggregate).hexdigest()
        key_id = params.backend_params.get("public_context_sha256") or f"session:{params.session_id}"
        ledger = ReleaseLedger(self.keys_dir / "releases.sqlite3")
        try:
            ledger.check(key_id, params.session_id, participants, agg_sha)
            backend = get_backend(params)
            if params.backend == "ckks":
                from secure_afl.backends.ckks import expected_abs_error

                vector = backend.reveal(aggregate, secret_context=self._secret(params.session_id))
                tol = expected_abs_error(params, len(participants))
            elif params.backend == "secagg":
                if unmask is None:
                    raise DecryptionRefused("secagg release needs the unmask material")
                vector = backend.reveal(aggregate, unmask=unmask)
                # each fixed-point entry is within 2^-(f+1) of its value: K of them summed
                tol = len(participants) * 2.0 ** -(params.backend_params["frac_bits"] + 1)
            else:
                vector = backend.reveal(aggregate)
                tol = 1e-9
            lay = Layout(params.layout.dim, params.layout.n_classes)
            stats = lay.unpack(vector, gamma=params.gamma)
            sanity = sanity_check(stats, params, len(participants), abs_tol=tol)
            tag_check = None
            if params.backend == "ckks":
                from secure_afl.tagging import check_aggregate_tag

                try:
                    tag_check = check_aggregate_tag(params, stats.tag, m, tags or {}, enrolled,
                                                    self._tag_secret(params.session_id), tol)
                except SecureAFLError as e:
                    ledger.block(key_id, f"aggregate tag check failed: {e}")
                    raise DecryptionRefused(f"not releasing: {e}", reason=e.reason) from e
            check_class_minimum(stats, min_class_count)
            W = solve_from_sums(stats, lam=lam)
            ledger.record(key_id, params.session_id, participants, agg_sha)
        finally:
            ledger.close()
        report = {
            "session_id": params.session_id,
            "backend": params.backend,
            "participants": participants,
            "contributors": len(participants),
            "samples": int(round(stats.n)),
            "class_counts": [int(round(c)) for c in stats.class_counts],
            "gamma": params.gamma,
            "lambda": lam,
            "aggregate_sha256": agg_sha,
            "params_digest": params.digest().hex(),
            "sanity": sanity.to_dict(),
            "tag_check": tag_check,
            "error_bound_per_entry": tol,
        }
        return FinalResult(W, stats, params, m, report)


# -- CLI ---------------------------------------------------------------------------------------
def _keyholder(args) -> KeyHolder:
    passphrase = None
    if getattr(args, "passphrase_file", None):
        passphrase = read_private_file(args.passphrase_file, "passphrase file").strip()
    return KeyHolder(args.pki, args.name, args.keys, passphrase=passphrase)


def _cmd_keygen(args) -> int:
    from .config import load_config
    from secure_afl.backends.ckks import ckks_session_params

    cfg = load_config(args.config)
    if cfg.backend != "ckks":
        print(f"session {cfg.session_id} uses {cfg.backend}; only ckks sessions need key-holder keys")
        return 2
    kh = _keyholder(args)
    params = ckks_session_params(cfg.session_id, Layout(cfg.dim, cfg.classes), cfg.gamma, cfg.bounds)
    public = kh.keygen(params)
    print(f"fresh CKKS keys for session {cfg.session_id}: public context {kh.public_path(cfg.session_id)} "
          f"({len(public)} bytes, sha256 {hashlib.sha256(public).hexdigest()[:16]}...)")
    return 0


def _cmd_publish(args) -> int:
    kh = _keyholder(args)
    with kh.connect(args.server, args.session) as conn:
        info = kh.publish(conn)
    print(f"session {info['session_id']} is {info['status']}; params digest {info['params_digest']}")
    return 0


def _cmd_finalize(args) -> int:
    kh = _keyholder(args)
    with kh.connect(args.server, args.session) as conn:
        res = kh.finalize(conn, min_clients=args.min_clients, lam=args.lam, min_class_count=args.min_class_count)
    meta = {"session": res.params.session_id, "backend": res.params.backend, "gamma": res.params.gamma,
            "lambda": args.lam, "classes": res.params.layout.n_classes, "participants": res.report["participants"]}
    write_model(args.out, res.W, meta)
    if args.report:
        Path(args.report).write_text(json.dumps(res.report, indent=2))
    print(f"model W {res.W.shape} from {res.report['contributors']} hospitals, {res.report['samples']} samples "
          f"-> {args.out}")
    return 0


def register(parser) -> None:
    sub = parser.add_subparsers(dest="keyholder_command", metavar="COMMAND", required=True)

    def common(p, online: bool):
        p.add_argument("--pki", required=True, help="consortium PKI directory")
        p.add_argument("--name", default="keyholder", help="this key holder's enrolled name")
        p.add_argument("--keys", required=True, help="key directory (secret contexts, release ledger)")
        p.add_argument("--passphrase-file", help=f"file with the at-rest passphrase (default: ${PASSPHRASE_ENV})")
        if online:
            p.add_argument("--server", required=True, help="https://host:port of the aggregation server")
            p.add_argument("--session", required=True)

    p = sub.add_parser("keygen", help="fresh CKKS keys for a session (secret stays here, encrypted at rest)")
    common(p, False)
    p.add_argument("--config", required=True, help="the session.toml the server runs")
    p.set_defaults(func=_cmd_keygen)
    p = sub.add_parser("publish", help="publish the session's public context to the server")
    common(p, True)
    p.set_defaults(func=_cmd_publish)
    p = sub.add_parser("finalize", help="close, verify the manifest, decrypt the aggregate, solve, write the model")
    common(p, True)
    p.add_argument("--min-clients", type=int, required=True, help="this key holder's own release threshold")
    p.add_argument("--min-class-count", type=int, default=1, help="refuse a release with a rarer present class")
    p.add_argument("--lambda", dest="lam", type=float, default=0.0, help="optional final ridge (default 0)")
    p.add_argument("--out", required=True, help="model file (.safetensors)")
    p.add_argument("--report", help="report JSON")
    p.set_defaults(func=_cmd_finalize)
