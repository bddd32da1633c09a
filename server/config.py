"""Session configuration (session.toml) for the aggregation server.

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
    threshold = 2               # Shamir t; default: majority of the hospitals
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

import datetime as _dt
import sys
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from secure_afl._validation import param_error
from secure_afl.params import BACKENDS, Bounds

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
    extractor: dict | None = None  # secure_afl.fingerprint.ExtractorFingerprint.to_dict()

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
            from secure_afl.fingerprint import ExtractorFingerprint

            fp = ExtractorFingerprint.from_dict(self.extractor)
            if fp.dim != self.dim or len(fp.classes) != self.classes:
                raise param_error("extractor", "session.toml",
                                  f"dim = {self.dim} and {self.classes} class names",
                                  f"dim = {fp.dim}, {len(fp.classes)} class names")
            self.extractor = fp.to_dict()
        if self.max_upload_bytes < 1024:
            raise param_error("max_upload_bytes", "session.toml", "an int >= 1024", self.max_upload_bytes)

    @property
    def connection_limit(self) -> int:
        """Open connections uvicorn serves at once: ``max_connections``, or when 0, k_max + 16 (at least 64).

        Only consortium members complete the mutual-TLS handshake, so a cap at the roster's size lets every
        hospital hold one connection and wait for a body slot. Below it, a crowd is turned away with 503 and
        comes back on new connections: at K = 1000 (ckks, d = 64, 2 cores) the old cap of 64 cost 7,705
        refusals and 69 s of server CPU, a cap of 1016 none and 29 s.
        """
        return self.max_connections or max(64, self.bounds.k_max + 16)


def _parse_deadline(value) -> float | None:
    if value is None:
        return None
    if isinstance(value, _dt.datetime):
        dt = value
    else:
        dt = _dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=_dt.timezone.utc)
    return dt.timestamp()


def load_config(path) -> ServerConfig:
    path = Path(path)
    with open(path, "rb") as fh:
        raw = tomllib.load(fh)
    s = raw.get("session", {})
    b = raw.get("bounds", {})
    sa = raw.get("secagg", {})
    srv = raw.get("server", {})
    dp = raw.get("dp")
    base = path.parent
    try:
        return ServerConfig(
            session_id=str(s["id"]),
            backend=str(s["backend"]),
            dim=int(s["dim"]),
            classes=int(s["classes"]),
            gamma=float(s.get("gamma", 1.0)),
            bounds=Bounds(float(b["max_norm"]), int(b["n_max"]), int(b["k_max"])),
            min_clients=int(s.get("min_clients", 3)),
            min_class_count=int(s.get("min_class_count", 5)),
            hospitals=[str(h) for h in s.get("hospitals", [])],
            deadline=_parse_deadline(s.get("deadline")),
            deadline_s=float(s["deadline_s"]) if "deadline_s" in s else None,
            max_upload_bytes=int(s.get("max_upload_bytes", 64_000_000)),
            data_dir=(base / srv.get("data_dir", "server-data")).resolve(),
            pki_dir=(base / srv.get("pki_dir", "pki")).resolve(),
            host=str(srv.get("host", "127.0.0.1")),
            port=int(srv.get("port", 8443)),
            name=str(srv.get("name", "aggregator")),
            keyholder=str(srv.get("keyholder", "keyholder")),
            require_client_cert=bool(srv.get("require_client_cert", True)),
            read_timeout_s=float(srv.get("read_timeout_s", 30.0)),
            body_timeout_s=float(srv.get("body_timeout_s", 600.0)),
            max_concurrent_uploads=int(srv.get("max_concurrent_uploads", 4)),
            max_connections=int(srv.get("max_connections", 0)),
            combine_workers=int(srv.get("combine_workers", 0)),
            refusal_interval_s=float(srv.get("refusal_interval_s", 60.0)),
            secagg_threshold=int(sa["threshold"]) if "threshold" in sa else None,
            secagg_neighbours=int(sa.get("neighbours", -1)),
            stage_timeout_s=float(sa.get("stage_timeout_s", 60.0)),
            secagg_max_rounds=int(sa.get("max_rounds", 3)),
            dp=_dp_spec(dp, int(s.get("min_clients", 3))) if dp is not None else None,
            extractor=dict(raw["extractor"]) if "extractor" in raw else None,
        )
    except KeyError as e:
        raise param_error(str(e.args[0]), "session.toml", "present", None) from None


def _dp_spec(d: dict, min_clients: int):
    from secure_afl.dp import DPSpec

    unknown = set(d) - {"epsilon", "delta", "noise_multiplier", "min_contributors", "beta"}
    if unknown:
        raise param_error(sorted(unknown)[0], "session.toml [dp]", "one of epsilon, delta, noise_multiplier, "
                          "min_contributors, beta", None)
    return DPSpec(epsilon=float(d["epsilon"]) if "epsilon" in d else None, delta=float(d.get("delta", 1e-5)),
                  min_contributors=int(d.get("min_contributors", min_clients)),
                  noise_multiplier=float(d["noise_multiplier"]) if "noise_multiplier" in d else None,
                  beta=float(d.get("beta", 0.01)))


def write_config(path, cfg: dict) -> None:
    """Write a session.toml from nested dicts (used by the demo and tests)."""
    lines = []
    for section, values in cfg.items():
        lines.append(f"[{section}]")
        for k, v in values.items():
            if isinstance(v, bool):
                lines.append(f"{k} = {'true' if v else 'false'}")
            elif isinstance(v, (int, float)):
                lines.append(f"{k} = {v!r}")
            elif isinstance(v, (list, tuple)):
                lines.append(f"{k} = [" + ", ".join(f'"{x}"' for x in v) + "]")
            else:
                lines.append(f'{k} = "{v}"')
        lines.append("")
    Path(path).write_text("\n".join(lines))
