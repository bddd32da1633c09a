"""Session configuration (session.toml) for the aggregation server.

Every key, its type, default, range and reader: docs/SESSION.md, generated
from :data:`secure_afl.session.schema.SECTIONS` by ``secure-afl session reference``.

Example::

    [session]
    id = "cohort-2026-11"
    backend = "ckks"            # plain | ckks | bfv | secagg
    dim = 512
    classes = 100
    gamma = 1.0                 # RI intermediary
    min_clients = 3             # the aggregate is never released below this (default 3)
    min_class_count = 5         # key holder refuses a release with a rarer present class (default 5)
    deadline = "2026-12-01T00:00:00Z"   # or deadline_s = 3600 (from first start)
    max_upload_bytes = 64_000_000
    hospitals = ["hosp-a", "hosp-b", "hosp-c"]   # enrolled; [] = all issued

    [bounds]
    max_norm = 40.0             # B: ||x||_2 <= B per embedding
    n_max = 100000              # n_k <= n_max
    k_max = 64                  # K <= K_max

    [secagg]                    # only for backend = "secagg"
    threshold = 2               # Shamir t; default: the largest t <= the majority that survives a dropout
    neighbours = -1             # -1 (default): SecAgg+ degree 2 ceil(1.5 log2 K) once smaller than K - 1;
                                # 0: complete graph (Bonawitz et al.); k: random k-regular graph
    stage_timeout_s = 60        # a hospital silent this long in a stage is dropped
    max_rounds = 3              # rounds per session: an aborted round is retried (fresh keys) up to this

    [dp]                        # optional: distributed differential privacy (secure_afl.dp)
    epsilon = 1.0               # target epsilon of one release (or noise_multiplier = z instead)
    delta = 1e-5
    min_contributors = 3        # t: the shares of any t hospitals add up to the full noise (default min_clients)

    [extractor]                 # optional: the feature extractor every hospital must use
    backbone = "resnet18"       # (`secure-afl client embed` prints this block for its run)
    weights = "sha256:5c8e..."  # sha256 of the weights file, or "random-seed:N" (tests only)
    preset = "paper"
    input_size = 224
    classes = ["benign", "malignant"]   # in label order; as many as [session] classes
    dim = 512                   # = [session] dim
    normalisation = "none"      # or "l2:R" (then max_norm >= R)

    [server]
    host = "127.0.0.1"
    port = 8443
    data_dir = "server-data"       # default: server-data/ next to session.toml
    pki_dir = "pki"                # default: pki/ next to session.toml
    name = "aggregator"
    keyholder = "keyholder"
    require_client_cert = true
    read_timeout_s = 30         # request headers, and each body chunk, must arrive within this
    body_timeout_s = 600        # a whole request body must arrive within this
    max_concurrent_uploads = 4  # bodies read at once; more are refused with 429 "busy"
    max_connections = 0         # open connections; more are answered 503 by uvicorn; 0 (default):
                                # k_max + 16, at least 64, so every hospital can wait for a body slot
    combine_workers = 0         # processes checking and adding ckks/bfv uploads at once; 0 (default): the
                                # cores when k_max uploads come to 64 MB or more, else 1
    refusal_interval_s = 60     # unauthenticated refusals: one audit record per peer per interval
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from secure_afl._validation import param_error
from secure_afl.params import BACKENDS, Bounds
from secure_afl import pki
from secure_afl.session.definition import normalise
from secure_afl.session.schema import load_toml, parse
from secure_afl.extractor import ExtractorFingerprint
from secure_afl.session.toml_writer import write_toml

__all__ = ["ServerConfig", "load_config"]


@dataclass
class ServerConfig:
    session_id: str
    backend: str
    dim: int
    classes: int
    gamma: float
    bounds: Bounds
    min_clients: int
    data_dir: Path
    pki_dir: Path
    hospitals: list[str] = field(default_factory=list)
    min_class_count: int = 5
    deadline: float | None = None  # absolute unix time
    deadline_s: float | None = None  # relative to the session's creation
    max_upload_bytes: int = 64_000_000
    colluders: int | None = None  # None: the session's default (secure_afl.cohort)
    max_refusals: int | None = None
    host: str = "127.0.0.1"
    port: int = 8443
    name: str = "aggregator"
    keyholder: str = "keyholder"
    require_client_cert: bool = True
    secagg_threshold: int | None = None
    secagg_neighbours: int = -1
    stage_timeout_s: float = 60.0
    secagg_max_rounds: int = 3
    dp: "DPSpec | None" = None
    read_timeout_s: float = 30.0
    body_timeout_s: float = 600.0
    max_concurrent_uploads: int = 4
    max_connections: int = 0
    combine_workers: int = 0
    refusal_interval_s: float = 60.0
    extractor: dict | None = None  # secure_afl.extractor.ExtractorFingerprint.to_dict()
    split: dict | None = None  # [split]: gram_proof, max_share
    ckks: dict | None = None  # [ckks]: flooding

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise param_error("backend", "session.toml", f"one of {BACKENDS}", self.backend)
        if self.min_clients < 1:
            raise param_error("min_clients", "session.toml", "an int >= 1", self.min_clients)
        if self.min_clients > self.bounds.k_max:
            raise param_error("min_clients", "session.toml", f"<= bounds.k_max={self.bounds.k_max}",
                              self.min_clients)
        for name in ("read_timeout_s", "body_timeout_s", "refusal_interval_s"):
            if not 0 < getattr(self, name) < 86400:
                raise param_error(name, "session.toml", "seconds in (0, 86400)", getattr(self, name))
        if not 1 <= self.secagg_max_rounds <= 100:
            raise param_error("max_rounds", "session.toml [secagg]", "an int in [1, 100]", self.secagg_max_rounds)
        if self.max_concurrent_uploads < 1:
            raise param_error("max_concurrent_uploads", "session.toml", "an int >= 1", self.max_concurrent_uploads)
        if self.max_connections < 0:
            raise param_error("max_connections", "session.toml [server]", "an int >= 1, or 0 (automatic)",
                              self.max_connections)
        if not 0 <= self.combine_workers <= 256:
            raise param_error("combine_workers", "session.toml [server]", "an int in [0, 256] (0: automatic)",
                              self.combine_workers)
        if self.extractor is not None:

            fp = ExtractorFingerprint.from_dict(self.extractor)
            if fp.dim != self.dim or len(fp.classes) != self.classes:
                raise param_error("extractor", "session.toml",
                                  f"dim = {self.dim} and {self.classes} class names",
                                  f"dim = {fp.dim}, {len(fp.classes)} class names")
            self.extractor = fp.to_dict()
        if self.max_upload_bytes < 1024:
            raise param_error("max_upload_bytes", "session.toml", "an int >= 1024", self.max_upload_bytes)

    @property
    def definition(self):
        """The session definition these settings describe (:mod:`secure_afl.session`), defaults filled in."""
        from secure_afl import pki

        s = {"id": self.session_id, "backend": self.backend, "dim": self.dim, "classes": self.classes,
             "gamma": float(self.gamma), "min_clients": self.min_clients, "min_class_count": self.min_class_count,
             "hospitals": list(self.hospitals), "deadline": self.deadline, "deadline_s": self.deadline_s,
             "max_upload_bytes": self.max_upload_bytes, "colluders": self.colluders,
             "max_refusals": self.max_refusals}
        sections = {"session": {k: v for k, v in s.items() if v is not None}, "bounds": self.bounds.to_dict()}
        if self.deadline is not None:
            import datetime as _dt

            sections["session"]["deadline"] = _dt.datetime.fromtimestamp(self.deadline, _dt.timezone.utc)
        if self.backend == "secagg":
            sa = {"threshold": self.secagg_threshold, "neighbours": self.secagg_neighbours,
                  "stage_timeout_s": float(self.stage_timeout_s), "max_rounds": self.secagg_max_rounds}
            sections["secagg"] = {k: v for k, v in sa.items() if v is not None}
        if self.dp is not None:
            sections["dp"] = {k: v for k, v in vars(self.dp).items() if v is not None}
        if self.extractor is not None:
            sections["extractor"] = dict(self.extractor)
        if self.split is not None:
            sections["split"] = dict(self.split)
        if self.ckks is not None:
            sections["ckks"] = dict(self.ckks)
        issued = (sorted(pki.load_enrolments(self.pki_dir, role="hospital"))
                  if (Path(self.pki_dir) / pki.CA_CERT).exists() else None)
        return normalise(parse(sections, source="the server's session settings"),
                                 issued_hospitals=issued, source="the server's session settings")

    @property
    def connection_limit(self) -> int:
        """Open connections uvicorn serves at once: ``max_connections``, or when 0, k_max + 16 (at least 64).

        Only consortium members complete the mutual-TLS handshake, so a cap at the roster's size lets every
        hospital hold one connection and wait for a body slot. Below it, a crowd is turned away with 503 and
        comes back on new connections: at K = 1000 (ckks, d = 64, 2 cores) the old cap of 64 cost 7,705
        refusals and 69 s of server CPU, a cap of 1016 none and 29 s.
        """
        return self.max_connections or max(64, self.bounds.k_max + 16)


def load_config(path) -> ServerConfig:
    """The server's view of ``session.toml``: the strict schema of :mod:`secure_afl.session` (an unknown
    or misspelled key, a wrong type or an impossible combination is refused, named), plus ``[server]``."""

    path = Path(path)
    sections = load_toml(path)
    srv = sections.get("server", {})
    base = path.parent
    pki_dir = (base / srv.get("pki_dir", "pki")).resolve()
    issued = sorted(pki.load_enrolments(pki_dir, role="hospital")) if (pki_dir / pki.CA_CERT).exists() else None
    d = normalise(sections, issued_hospitals=issued, source=str(path)).body
    sa = d["secagg"] or {}
    return ServerConfig(
        session_id=d["id"], backend=d["backend"], dim=d["dim"], classes=d["classes"], gamma=d["gamma"],
        bounds=Bounds(**d["bounds"]), min_clients=d["min_clients"], min_class_count=d["min_class_count"],
        hospitals=list(d["hospitals"]), deadline=d["deadline"], deadline_s=d["deadline_s"],
        max_upload_bytes=d["max_upload_bytes"], colluders=d["colluders"], max_refusals=d["max_refusals"],
        data_dir=(base / srv.get("data_dir", "server-data")).resolve(), pki_dir=pki_dir,
        host=srv.get("host", "127.0.0.1"), port=srv.get("port", 8443), name=srv.get("name", "aggregator"),
        keyholder=srv.get("keyholder", "keyholder"), require_client_cert=srv.get("require_client_cert", True),
        read_timeout_s=srv.get("read_timeout_s", 30.0), body_timeout_s=srv.get("body_timeout_s", 600.0),
        max_concurrent_uploads=srv.get("max_concurrent_uploads", 4), max_connections=srv.get("max_connections", 0),
        combine_workers=srv.get("combine_workers", 0), refusal_interval_s=srv.get("refusal_interval_s", 60.0),
        secagg_threshold=sa.get("threshold"), secagg_neighbours=sa.get("neighbours", -1),
        stage_timeout_s=sa.get("stage_timeout_s", 60.0), secagg_max_rounds=sa.get("max_rounds", 3),
        dp=_dp_spec(d["dp"]) if d["dp"] is not None else None, extractor=d["extractor"], split=d["split"],
        ckks=d.get("ckks"),
    )


def _dp_spec(d: dict):
    from secure_afl.dp import DPSpec

    return DPSpec(**d)


def write_config(path, cfg: dict) -> None:
    """Write a session.toml from nested dicts (demo and tests), every string escaped."""

    write_toml(path, cfg)
