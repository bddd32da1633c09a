"""The session definition: one strict schema, one loader, and the operator's signature every party pins.

What a session *is* (backend, the fixed roster of hospitals, bounds, layout,
gamma, min_clients, the secagg threshold / graph degree / round limit, the DP
spec, the feature extractor, deadlines) changes what the protocol protects,
so no party may learn it from the server. The consortium operator writes it
in ``session.toml``, and ``secure-afl session sign`` turns it into a signed
definition::

    {"definition": {...canonical, every default filled in...},
     "signature": "<hex ECDSA P-256 / SHA-256 by the consortium CA key>"}

over ``b"secure-afl/session/v1\\0" + canonical JSON of the definition``. It
lands in ``<pki>/sessions/<id>.json`` of the operator's PKI directory and of
every party's bundle. The CA key is the operator's key: it already signs the
roster, and a party pins nothing else (``ca.pem`` comes with its bundle). The
server, the hospitals, the key holder and the Flower apps all call
:func:`load_signed` and build the session parameters with
:meth:`SessionDefinition.session_params`, so there is one derivation; a
value the server relays that disagrees is refused with the field named
(:func:`check_same`).

The definition is canonical JSON rather than TOML because a signature needs
one byte string per value; ``session.toml`` stays the file people edit, and
:func:`write_toml` writes one that escapes every string (TOML basic strings).

Strictness: an unknown or misspelled section or key is refused with its name
and the closest known one (``min_client`` -> ``min_clients``); a wrong type
(``dim = "512"``, ``gamma = true``) is refused; impossible combinations
(``min_clients`` above the roster, a secagg threshold above the share
holders, a quorum nobody can reach) are refused when the operator signs.
``[server]`` (host, port, directories, timeouts of the HTTP layer) is
deployment, not protocol: it is checked here but not signed.
"""

from __future__ import annotations

import datetime as _dt
import difflib
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from . import domains
from .encoding import canonical_json
from .exceptions import InvalidParameterError, InvalidSignature, MissingEnrolment, ParameterMismatch, WrongSession
from secure_afl import pki
from secure_afl.extractor import ExtractorFingerprint
from secure_afl.packing import Layout
from secure_afl.params import BACKENDS
from secure_afl.params import Bounds
from secure_afl.params import SessionParams
from secure_afl.secagg import consistency_quorum, dropout_tolerance
from secure_afl.secagg import recommended_neighbours, secagg_session_params
from secure_afl.tagging import TAG_KEY_PARAM

__all__ = ["SessionDefinition", "SCHEMA", "SECTIONS", "Key", "dropout_line", "share_line", "reference",
           "parse", "load_toml", "normalise", "sign", "load_signed",
           "check_same", "check_info", "write_toml", "signed_path", "sign_definition", "from_body"]

_PREFIX = domains.SESSION
SESSIONS_DIR = "sessions"

# ---------------------------------------------------------------------------------------------
# The schema: every section and key, its type, default, range, readers and meaning (one home;
# docs/SESSION.md is generated from it by `secure-afl session reference`)
# ---------------------------------------------------------------------------------------------
#: a key with no default must be given
REQUIRED = object()
_ALL = "server, hospitals, key holder"


@dataclass(frozen=True)
class Key:
    """One key of ``session.toml``.

    ``kind``: "int" (no bool), "real" (int or float, no bool), "str", "bool",
    "strs" (list of str), "time" (TOML datetime or ISO string). ``low`` and
    ``high`` bound a number (inclusive; ``low_open`` makes the lower bound
    strict, ``high_open`` the upper) and are checked at load; ``default_text`` says what a default
    computed from other keys is.
    """

    kind: str
    meaning: str
    default: Any = REQUIRED
    readers: str = _ALL
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    default_text: str | None = None
    allowed: str | None = None

    def range_text(self) -> str:
        if self.allowed is _BACKEND_WORDS:
            from .params import BACKENDS

            return "one of " + ", ".join(BACKENDS)
        if self.allowed:
            return self.allowed
        if self.low is None and self.high is None:
            return ""
        lo = "" if self.low is None else f"{'>' if self.low_open else '>='} {_num(self.low)}"
        hi = "" if self.high is None else f"{'<' if self.high_open else '<='} {_num(self.high)}"
        return ", ".join(x for x in (lo, hi) if x)

    def default_words(self) -> str:
        if self.default_text:
            return self.default_text
        if self.default is REQUIRED:
            return "required"
        return "none" if self.default is None else _toml_value(self.default)


def _num(x) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


_BACKEND_WORDS = "one of the backends of `secure_afl.params.BACKENDS`"


@dataclass(frozen=True)
class Section:
    meaning: str
    keys: Mapping[str, Key]
    signed: bool = True


SECTIONS: dict[str, Section] = {
    "session": Section("What the session is; every key is signed.", {
        "id": Key("str", "session id, bound into every signature, upload and receipt",
                  allowed="1-64 of A-Z a-z 0-9 . _ -, starting with a letter or digit"),
        "backend": Key("str", "how uploads are protected", allowed=_BACKEND_WORDS),
        "dim": Key("int", "embedding dimension d of every hospital's features", low=1, high=65536),
        "classes": Key("int", "number of classes C", low=1, high=1_000_000),
        "gamma": Key("real", "RI intermediary: each hospital adds gamma I to its C_k; the key holder removes it",
                     1.0, low=0.0),
        "min_clients": Key("int", "the aggregate is never released over fewer hospitals (secagg: also sizes the "
                                  "consistency quorum)", 3, "server, hospitals (secagg), key holder", low=1,
                           allowed=">= 1, <= the number of hospitals"),
        "min_class_count": Key("int", "the key holder refuses a release in which a present class has fewer "
                                      "samples", 5, "key holder", low=1),
        "deadline": Key("time", "uploads after this instant are refused", None, "server, hospitals",
                        allowed="a TOML date-time or ISO 8601 string; not with deadline_s"),
        "deadline_s": Key("real", "uploads later than this many seconds after the server first started are "
                                  "refused", None, "server, hospitals", low=0.0, low_open=True,
                          allowed="> 0; not with deadline"),
        "max_upload_bytes": Key("int", "largest upload body the server reads", 64_000_000, "server, hospitals",
                                low=1024),
        "colluders": Key("int", "c: hospitals that may collude with the server; every release needs q = "
                                "max(floor((n + c) / 2) + 1, min_clients + c) hospitals of the roster after every "
                                "refusal", None, _ALL, low=0,
                         default_text="secagg: threshold - 1; else the largest c <= min_clients - 1 that lets one "
                                      "hospital drop out (0 if none does)",
                         allowed="secagg: = threshold - 1; else q <= n, and n - q >= 1 when c >= 1"),
        "max_refusals": Key("int", "split: uploads the key holder may refuse as invalid before the release is "
                                   "aborted instead of formed without them", None, "server, key holder", low=0,
                            default_text="colluders"),
        "hospitals": Key("strs", "the session's roster (fixed n): only these hospitals may take part; may be "
                                 "a subset of the hospitals the PKI issued", [],
                         default_text="[] = every hospital issued in the operator's PKI at signing",
                         allowed="distinct names, each issued by `secure-afl pki issue`; at most k_max"),
    }),
    "bounds": Section("Declared bounds that size the protection parameters; every key is signed.", {
        "max_norm": Key("real", "B: every embedding satisfies ||x||_2 <= B", low=0.0, low_open=True),
        "n_max": Key("int", "largest number of samples one hospital contributes", low=1),
        "k_max": Key("int", "largest number of hospitals summed (no-wrap and noise bounds)", low=1,
                     allowed=">= the number of hospitals"),
    }),
    "split": Section("Only with backend = \"split\"; every key is signed (docs/VALIDITY.md).", {
        "gram_proof": Key("bool", "every upload also proves its statistics [[C, Q], [Q^T, diag(counts)]] positive "
                                  "semi-definite (a Gram matrix of bounded rows), and the release refuses an "
                                  "indefinite Gram sum; about +1.1 MB per upload at d = 512, C = 100; not with [dp]",
                          False, "server, hospitals, key holder"),
        "max_share": Key("real", "largest share of the pooled samples one hospital may hold: the release is "
                                 "refused unless n_max <= max_share * n (n the released sample count)", 1.0,
                         "server, key holder", low=0.0, low_open=True, high=1.0),
    }),
    "secagg": Section("Only with backend = \"secagg\"; every key is signed.", {
        "threshold": Key("int", "Shamir threshold t: tolerates t - 1 colluding hospitals next to a malicious "
                                "server; the consistency quorum grows with it", None, "server, hospitals",
                         low=2, default_text="the largest t <= floor(m/2) + 1 (m share holders per hospital) "
                                             "that lets one hospital drop out; floor(m/2) + 1 if none does",
                         allowed=">= 2, <= m = neighbours + 1"),
        "neighbours": Key("int", "degree k of the SecAgg+ neighbour graph", -1, "server, hospitals", low=-1,
                          allowed="-1: 2 ceil(1.5 log2 n) once smaller than n - 1; 0: complete graph; "
                                  "else even, >= 2"),
        "stage_timeout_s": Key("real", "a hospital silent this long in a stage is dropped from the round", 60.0,
                               "server", low=0.0, low_open=True),
        "max_rounds": Key("int", "rounds per session: an aborted round is retried with fresh keys up to this",
                          3, "server, hospitals", low=1, high=100),
    }),
    "dp": Section("Optional distributed differential privacy (docs/DP.md); every key is signed.", {
        "epsilon": Key("real", "target epsilon of one release", None, "hospitals, key holder", low=0.0,
                       low_open=True, allowed="> 0; exactly one of epsilon and noise_multiplier"),
        "delta": Key("real", "target delta of one release", 1e-5, "hospitals, key holder", low=0.0, high=0.1,
                     low_open=True, high_open=True),
        "noise_multiplier": Key("real", "Gaussian noise multiplier z, instead of epsilon", None,
                                "hospitals, key holder", low=0.0, low_open=True),
        "min_contributors": Key("int", "the shares of any this many hospitals add up to the full noise", None,
                                "hospitals, key holder", low=1, default_text="min_clients",
                                allowed=">= 1, <= the number of hospitals"),
        "beta": Key("real", "failure probability of the DP accounting's bounds", 0.01, "hospitals, key holder",
                    low=0.0, high=0.5, low_open=True, high_open=True),
    }),
    "extractor": Section("Optional: the feature extractor every hospital must use (`secure-afl client embed` "
                         "prints this block); every key is signed.", {
        "backbone": Key("str", "backbone name", readers="hospitals, key holder"),
        "weights": Key("str", "sha256 of the weights file, or \"random-seed:N\" (tests only)",
                       readers="hospitals, key holder"),
        "preset": Key("str", "preprocessing preset", readers="hospitals, key holder"),
        "input_size": Key("int", "input image size in pixels", readers="hospitals, key holder", low=1),
        "classes": Key("strs", "class names in label order", readers="hospitals, key holder",
                       allowed="as many as [session] classes"),
        "dim": Key("int", "embedding dimension", readers="hospitals, key holder", allowed="= [session] dim"),
        "normalisation": Key("str", "\"none\" or \"l2:R\"", readers="hospitals, key holder",
                             allowed="\"none\", or \"l2:R\" with max_norm >= R"),
    }),
    "server": Section("Deployment of the aggregation server: checked, never signed.", {
        "host": Key("str", "address to listen on", "127.0.0.1", "server"),
        "port": Key("int", "TCP port", 8443, "server", low=1, high=65535),
        "data_dir": Key("str", "where the server keeps its database, uploads and audit log", "server-data",
                        "server", default_text="server-data/ next to session.toml"),
        "pki_dir": Key("str", "the server's PKI bundle", "pki", "server", default_text="pki/ next to session.toml"),
        "name": Key("str", "the server's enrolled name", "aggregator", "server"),
        "keyholder": Key("str", "the key holder's enrolled name", "keyholder", "server"),
        "require_client_cert": Key("bool", "mutual TLS: every client presents its consortium certificate", True,
                                   "server"),
        "read_timeout_s": Key("real", "request headers, and each body chunk, must arrive within this", 30.0,
                              "server", low=0.0, high=86400.0, low_open=True),
        "body_timeout_s": Key("real", "a whole request body must arrive within this", 600.0, "server", low=0.0,
                              high=86400.0, low_open=True),
        "max_concurrent_uploads": Key("int", "bodies read at once; more are refused with 429", 4, "server", low=1),
        "max_connections": Key("int", "open connections; more are answered 503", 0, "server", low=0,
                               default_text="0 = k_max + 16, at least 64"),
        "combine_workers": Key("int", "processes checking and adding ckks/bfv uploads at once", 0, "server",
                               low=0, high=256, default_text="0 = the cores when k_max uploads come to 64 MB "
                                                             "or more, else 1"),
        "refusal_interval_s": Key("real", "unauthenticated refusals: one audit record per peer per interval",
                                  60.0, "server", low=0.0, high=86400.0, low_open=True),
    }, signed=False),
}

# type tags by section and key (what parse checks)
SCHEMA: dict[str, dict[str, str]] = {s: {k: key.kind for k, key in sec.keys.items()} for s, sec in SECTIONS.items()}
#: keys without a default: always for [session] and [bounds], and for a section once it is given
_REQUIRED = {s: tuple(k for k, key in sec.keys.items() if key.default is REQUIRED) for s, sec in SECTIONS.items()}
#: sections that are deployment only: checked, never signed
_UNSIGNED = tuple(s for s, sec in SECTIONS.items() if not sec.signed)


_TYPE_WORDS = {"int": "an integer", "real": "a number", "str": "a string", "bool": "true or false",
               "strs": "a list of strings", "time": "a date-time (e.g. 2026-12-01T00:00:00Z)"}


def _suggest(word: str, known) -> str:
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(sorted(known))})"


def _fail(where: str, msg: str) -> InvalidParameterError:
    return InvalidParameterError(f"{where}: {msg}")


def _typed(where: str, key: str, kind: str, value):
    ok = {
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "real": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
        "str": lambda v: isinstance(v, str),
        "bool": lambda v: isinstance(v, bool),
        "strs": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
        "time": lambda v: isinstance(v, (str, _dt.datetime)),
    }[kind]
    if not ok(value):
        raise _fail(where, f"{key} must be {_TYPE_WORDS[kind]}, not {value!r}")
    if kind == "real":
        return float(value)
    if kind == "strs":
        return list(value)
    if kind == "time":
        return _timestamp(where, key, value)
    return value


def _timestamp(where: str, key: str, value) -> float:
    try:
        dt = value if isinstance(value, _dt.datetime) else _dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise _fail(where, f"{key} must be {_TYPE_WORDS['time']}, not {value!r}") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=_dt.timezone.utc)
    return dt.timestamp()


def _ranged(where: str, key: str, spec: Key, value):
    """Refuse a number outside the key's declared range, naming the range."""
    if spec.kind not in ("int", "real"):
        return value
    low_bad = spec.low is not None and (value <= spec.low if spec.low_open else value < spec.low)
    high_bad = spec.high is not None and (value >= spec.high if spec.high_open else value > spec.high)
    if low_bad or high_bad:
        raise _fail(where, f"{key} must be {spec.range_text()}, not {value!r}")
    return value


def _default(section: str, key: str):
    d = SECTIONS[section].keys[key].default
    return list(d) if isinstance(d, list) else d


def parse(raw: Mapping[str, Any], *, source: str = "session.toml") -> dict[str, dict[str, Any]]:
    """The sections of a session file, every key known and of its type (nothing filled in yet)."""
    if not isinstance(raw, Mapping):
        raise _fail(source, "is not a table of sections")
    out: dict[str, dict[str, Any]] = {}
    for section, body in raw.items():
        if section not in SCHEMA:
            raise _fail(source, f"unknown section [{section}]{_suggest(section, SCHEMA)}")
        if not isinstance(body, Mapping):
            raise _fail(source, f"[{section}] must be a table")
        where = f"{source} [{section}]"
        known = SCHEMA[section]
        out[section] = {}
        for key, value in body.items():
            if key not in known:
                raise _fail(where, f"unknown key {key!r}{_suggest(key, known)}")
            out[section][key] = _ranged(where, key, SECTIONS[section].keys[key], _typed(where, key, known[key], value))
    for section, keys in _REQUIRED.items():
        if section not in ("session", "bounds") and section not in out:
            continue
        for key in keys:
            if key not in out.get(section, {}):
                raise _fail(f"{source} [{section}]", f"{key} is required")
    return out


def load_toml(path) -> dict[str, dict[str, Any]]:
    """:func:`parse` of a TOML file; a TOML syntax error is one line naming the file."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            raw = tomllib.load(fh)
    except tomllib.TOMLDecodeError as e:
        raise InvalidParameterError(f"{path} is not valid TOML: {e}", reason="invalid_toml") from None
    return parse(raw, source=str(path))


# ---------------------------------------------------------------------------------------------
# The canonical definition
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SessionDefinition:
    """The signed part of a session, every default filled in. ``body`` is what the operator signs."""

    body: Mapping[str, Any]

    def __getitem__(self, key):
        return self.body[key]

    @property
    def session_id(self) -> str:
        return self.body["id"]

    @property
    def backend(self) -> str:
        return self.body["backend"]

    @property
    def hospitals(self) -> list[str]:
        return list(self.body["hospitals"])

    @property
    def client_ids(self) -> dict[str, int]:
        """secagg numbering: the signed roster in sorted order, ids 1..n."""
        return {h: i + 1 for i, h in enumerate(sorted(self.body["hospitals"]))}

    def canonical(self) -> bytes:
        return canonical_json(self.body)

    def bounds(self):
        from .params import Bounds

        b = self.body["bounds"]
        return Bounds(b["max_norm"], b["n_max"], b["k_max"])

    def dp_spec(self):
        if self.body["dp"] is None:
            return None
        from .dp import DPSpec

        return DPSpec(**self.body["dp"])

    def session_params(self):
        """The session's :class:`~secure_afl.params.SessionParams` before any key exists (the one derivation).

        plain and secagg: exactly the parameters every upload signs. ckks and
        bfv: the key holder's keygen adds its context hash and tag key to
        ``backend_params`` and signs the result.
        """
        from .dp import dp_session_params
        from .packing import Layout

        b = self.body
        layout = Layout(b["dim"], b["classes"])
        if b["backend"] == "split" and b.get("split"):
            params = dp_session_params(self.dp_spec(), "split", b["id"], layout, b["gamma"], self.bounds(),
                                       **b["split"])
        elif b["backend"] != "secagg":
            params = dp_session_params(self.dp_spec(), b["backend"], b["id"], layout, b["gamma"], self.bounds())
        else:
            sa = b["secagg"]
            params = dp_session_params(self.dp_spec(), "secagg", b["id"], layout, b["gamma"], self.bounds(),
                                       n_parties=len(b["hospitals"]), threshold=sa["threshold"],
                                       neighbours=sa["neighbours"] or None, min_clients=b["min_clients"])
        return params.with_extractor(b["extractor"])


def normalise(sections: Mapping[str, Mapping[str, Any]], *, issued_hospitals=None,
              source: str = "session.toml") -> SessionDefinition:
    """The canonical definition of parsed sections; refuses combinations no session can run.

    ``hospitals = []`` (or absent) means every hospital issued in the
    operator's PKI (``issued_hospitals``); the signed definition always names
    them, so n is fixed before the session starts.
    """

    s = dict(sections.get("session", {}))
    where = f"{source} [session]"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", s["id"]):
        raise _fail(where, f"id must be letters, digits, '.', '_' or '-' (at most 64), not {s['id']!r}")
    if s["backend"] not in BACKENDS:
        raise _fail(where, f"backend must be one of {', '.join(BACKENDS)}, not {s['backend']!r}"
                    f"{_suggest(s['backend'], BACKENDS)}")
    hospitals = s.get("hospitals") or sorted(issued_hospitals or [])
    if not hospitals:
        raise _fail(where, "hospitals is empty and no hospital is issued: name the session's hospitals")
    if len(set(hospitals)) != len(hospitals):
        raise _fail(where, f"hospitals lists a hospital twice: {hospitals}")
    if issued_hospitals is not None:
        missing = sorted(set(hospitals) - set(issued_hospitals))
        if missing:
            raise MissingEnrolment(f"{where}: hospitals {missing} have no enrolment in the PKI; issue them with "
                                   "`secure-afl pki issue`")
    b = dict(sections["bounds"])
    body: dict[str, Any] = {
        "v": 1, "id": s["id"], "backend": s["backend"], "dim": s["dim"], "classes": s["classes"],
        **{k: s.get(k, _default("session", k)) for k in ("gamma", "min_clients", "min_class_count", "deadline",
                                                          "deadline_s", "max_upload_bytes", "colluders",
                                                          "max_refusals")},
        "hospitals": sorted(hospitals),
        "bounds": {"max_norm": b["max_norm"], "n_max": b["n_max"], "k_max": b["k_max"]},
        "secagg": None, "dp": None, "extractor": None, "split": None,
    }
    if not 1 <= body["min_clients"] <= len(hospitals):
        raise _fail(where, f"min_clients = {body['min_clients']} must be in [1, {len(hospitals)}], the number of "
                           "hospitals in the session")
    if len(hospitals) > body["bounds"]["k_max"]:
        raise _fail(f"{source} [bounds]", f"k_max = {body['bounds']['k_max']} is below the {len(hospitals)} "
                                          "hospitals of the session")
    if body["deadline_s"] is not None and body["deadline"] is not None:
        raise _fail(where, "give deadline or deadline_s, not both")
    sa = sections.get("secagg")
    if sa is not None and s["backend"] != "secagg":
        raise _fail(source, f"[secagg] is for backend = \"secagg\", and this session runs {s['backend']}")
    if s["backend"] == "secagg":
        sa = dict(sa or {})
        body["secagg"] = {k: sa.get(k, _default("secagg", k)) for k in SCHEMA["secagg"]}
    sp = sections.get("split")
    if sp is not None:
        if s["backend"] != "split":
            raise _fail(source, f"[split] is for backend = \"split\", and this session runs {s['backend']}")
        body["split"] = {k: sp.get(k, _default("split", k)) for k in SCHEMA["split"]}
    if "dp" in sections:
        d = dict(sections["dp"])
        body["dp"] = {k: d.get(k, _default("dp", k)) for k in SCHEMA["dp"]}
        if body["dp"]["min_contributors"] is None:
            body["dp"]["min_contributors"] = body["min_clients"]
        if body["dp"]["min_contributors"] > len(hospitals):
            raise _fail(f"{source} [dp]", f"min_contributors = {body['dp']['min_contributors']} is above the "
                                          f"{len(hospitals)} hospitals of the session: the noise would never add up")
    if "extractor" in sections:

        fp = ExtractorFingerprint.from_dict(sections["extractor"])
        if fp.dim != body["dim"] or len(fp.classes) != body["classes"]:
            raise _fail(f"{source} [extractor]", f"declares dim = {fp.dim} and {len(fp.classes)} class names; "
                                                 f"the session has dim = {body['dim']} and {body['classes']} classes")
        body["extractor"] = fp.to_dict()
    if s["backend"] == "secagg":
        _resolve_secagg(body, source)
    _resolve_colluders(body, where)
    definition = SessionDefinition(body)
    try:
        definition.session_params()  # every remaining impossibility (DP on a backend without it, ...)
    except InvalidParameterError as e:
        raise _fail(source, str(e)) from None
    return definition


def _resolve_secagg(body: dict, source: str) -> None:
    """Fill in the threshold and degree the defaults give for this roster, so the signed values are final."""

    sa, n = body["secagg"], len(body["hospitals"])
    if n < 2:
        raise _fail(f"{source} [session]", "a secagg session needs at least 2 hospitals")
    k = {-1: recommended_neighbours(n), 0: None}.get(sa["neighbours"], sa["neighbours"])
    b = body["bounds"]
    try:
        p = secagg_session_params(body["id"], Layout(body["dim"], body["classes"]), body["gamma"],
                                  Bounds(b["max_norm"], b["n_max"], b["k_max"]), threshold=sa["threshold"],
                                  neighbours=k, n_parties=n, min_clients=body["min_clients"])
    except InvalidParameterError as e:
        raise _fail(f"{source} [secagg]", str(e)) from None
    sa["threshold"] = p.backend_params["threshold"]
    sa["neighbours"] = p.backend_params["neighbours"] or 0  # 0: the complete graph


def _resolve_colluders(body: dict, where: str) -> None:
    """Fill in the colluder bound c and the refusal limit, and refuse a c no release could meet (q > n) or,
    for c >= 1, one that leaves no hospital free to drop out (lower c, or min_clients)."""
    from .cohort import default_colluders, quorum

    n, mc = len(body["hospitals"]), body["min_clients"]
    if body["backend"] == "secagg":
        c = body["secagg"]["threshold"] - 1  # Shamir: t - 1 colluders learn nothing from the shares
        if body["colluders"] is not None and body["colluders"] != c:
            raise _fail(where, f"colluders = {body['colluders']}: a secagg session tolerates threshold - 1 = {c} "
                               "colluders; set the threshold instead")
    else:
        c = default_colluders(n, mc) if body["colluders"] is None else body["colluders"]
    q = quorum(n, c, mc)
    # secagg's threshold checks already ran (its line says when none may drop out)
    if body["backend"] != "secagg" and (q > n or (c >= 1 and n - q < 1)):
        raise _fail(where, f"colluders = {c} leaves no dropout tolerance: a release needs q = max(floor((n + c) / 2)"
                           f" + 1, min_clients + c) = {q} of the n = {n} hospitals; lower colluders or min_clients")
    body["colluders"] = c
    body["max_refusals"] = c if body["max_refusals"] is None else body["max_refusals"]


# ---------------------------------------------------------------------------------------------
# What a session survives, and the reference of the schema
# ---------------------------------------------------------------------------------------------
def dropout_line(definition: SessionDefinition) -> tuple[int, str]:
    """How many hospitals may drop out or go silent and the session still releases, and why (one line).

    plain, ckks, bfv, split: a release needs the quorum q of the roster
    (:mod:`secure_afl.cohort`), so ``n - q``. secagg: :func:`~secure_afl.secagg.dropout_tolerance`
    (every stage after setup needs the quorum q of the fixed n, and every
    hospital t of its m share holders). A session that survives none says
    what would let it survive one.
    """
    from .cohort import quorum

    b = definition.body
    n, mc = len(b["hospitals"]), b["min_clients"]
    if b["backend"] != "secagg":
        c = b["colluders"]
        q = quorum(n, c, mc)
        k = n - q
        line = (f"{k} of {n} hospitals may drop out, go silent or be refused and session {b['id']} still releases: "
                f"a release needs q = max(floor((n + c) / 2) + 1, min_clients + c) = {q} roster hospitals "
                f"(c = {c} colluders tolerated, min_clients = {mc})")
        fix = f"min_clients = {mc - 1}" if mc > 1 else "more hospitals"
    else:

        sa = b["secagg"]
        t, m = sa["threshold"], (sa["neighbours"] + 1 if sa["neighbours"] else n)
        q = consistency_quorum(n, t, mc)
        k = dropout_tolerance(n, t, mc, m)
        line = (f"{k} of {n} hospitals may drop out or go silent and a round of session {b['id']} still releases: "
                f"every stage after setup needs the quorum q = max(floor((n + c) / 2) + 1, min_clients + c) = {q} "
                f"of the n = {n} (threshold t = {t}: c = {t - 1} colluders tolerated, min_clients = {mc})")
        if m - t < n - q:
            line += (f", and {t} of each hospital's {m} share holders answer (any {m - t} dropouts; up to {n - q} "
                     "spread over different neighbourhoods)")
        lower_t = [t2 for t2 in range(t - 1, 1, -1) if dropout_tolerance(n, t2, mc, m) >= 1]
        lower_mc = [c2 for c2 in range(mc - 1, 0, -1) if dropout_tolerance(n, t, c2, m) >= 1]
        fix = " or ".join(([f"threshold = {lower_t[0]} ({lower_t[0] - 1} colluder{'s' if lower_t[0] > 2 else ''})"] if lower_t else [])
                          + ([f"min_clients = {lower_mc[0]}"] if lower_mc else [])) or \
            f"at least {max(4, mc + 2)} hospitals (threshold = 2)"
    if k == 0:
        line += f"; no hospital may drop out: to tolerate one, sign a session with {fix}"
    return k, line


def share_line(definition: SessionDefinition) -> str:
    """The largest share of the pooled samples one hospital may hold (one line): its n_max against the others,
    and the session's cap. Steering is bounded by it, whatever the upload proves (docs/VALIDITY.md)."""
    b = definition.body
    n, n_max = len(b["hospitals"]), b["bounds"]["n_max"]
    cap = (b.get("split") or {}).get("max_share", 1.0)
    line = (f"one hospital may hold up to n_max = {n_max} samples: {100.0 / n:.3g} % of the pooled statistics if "
            f"the other {n - 1} hold n_max each, all of them if they hold none")
    if cap < 1.0:
        line += (f"; capped at max_share = {cap:g}: a release needs at least {math.ceil(n_max / cap)} samples "
                 "in all")
    else:
        line += "; no cap (a split session may set [split] max_share)"
    return line


def reference() -> str:
    """docs/SESSION.md: every section and key of :data:`SECTIONS` (``secure-afl session reference``)."""
    from .params import BACKENDS

    out = ["# session.toml reference", "",
           "<!-- generated from secure_afl/session.py by `secure-afl session reference`; edit the schema, "
           "not this file -->", "",
           "The operator writes `session.toml` and signs it with `secure-afl session sign session.toml --pki PKI "
           "--bundles BUNDLES`; every party then reads the signed definition from its own bundle. Unknown keys, "
           "wrong types, values outside the range below and impossible combinations are refused at load, one "
           "line naming the key. Backends: " + ", ".join(f"`{x}`" for x in BACKENDS) + ".", "",
           "Before it signs, `session sign` prints how many hospitals may drop out or go silent with the session "
           "still releasing (plain, ckks, bfv, split: n - q with q = max(floor((n + c) / 2) + 1, min_clients + c), c "
           "the signed colluder bound; secagg: min(n - q, m - t)); `server run` and "
           "`session show` print the same line. It also prints the largest share of the pooled samples one "
           "hospital may hold (its n_max against the other hospitals at n_max each, and `[split] max_share` "
           "when set): what bounds how far one hospital can steer W (docs/VALIDITY.md).", "",
           "`[split] gram_proof` is off by default, chosen by measurement (docs/VALIDITY.md, \"The Gram "
           "statement\"): at d = 512, C = 100 it adds 1.5 MB (about 50 %) to each upload and about 2.9 times "
           "the proving and verifying time, it moves an honest hospital's statistics by the factor's rounding "
           "(W relative 2.6e-4 at d = 512), and it cannot be combined with [dp]. Turn it on for a session "
           "without DP in which no hospital may dictate W: it refuses indefinite statistics by name and makes "
           "the release refuse an indefinite sum.", ""]
    for name, sec in SECTIONS.items():
        out += [f"## [{name}]", "", sec.meaning, "",
                "| key | type | default | allowed | read by | meaning |", "|---|---|---|---|---|---|"]
        for key, spec in sec.keys.items():
            cells = [f"`{key}`", _TYPE_WORDS[spec.kind], spec.default_words(), spec.range_text() or "any",
                     spec.readers, spec.meaning]
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Signing and pinning
# ---------------------------------------------------------------------------------------------
def _message(body: Mapping) -> bytes:
    return _PREFIX + canonical_json(body)


def signed_path(pki_dir, session_id: str) -> Path:
    return Path(pki_dir) / SESSIONS_DIR / f"{session_id}.json"


def sign(toml_path, pki_dir, *, bundles_dir=None) -> tuple[SessionDefinition, list[Path]]:
    """Operator: check ``session.toml`` strictly, sign its definition with the CA key, and place it.

    Written to ``<pki_dir>/sessions/<id>.json`` and, with ``bundles_dir``, into
    every bundle there (:func:`sign_definition`).
    """

    sections = load_toml(toml_path)
    issued = pki.load_enrolments(pki_dir, role="hospital")
    definition = normalise(sections, issued_hospitals=sorted(issued), source=str(toml_path))
    return definition, sign_definition(definition, pki_dir, bundles_dir=bundles_dir)


def sign_definition(definition: SessionDefinition, pki_dir, *, bundles_dir=None) -> list[Path]:
    """Sign ``definition`` with the CA key of ``pki_dir``; place it there and in every bundle of ``bundles_dir``.

    A definition already placed under the same id is replaced only by the same
    one: a session's definition never changes once handed out.
    """
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    from . import pki

    body = dict(definition.body)
    body["ca_sha256"] = pki.cert_fingerprint(pki.load_certificate(Path(pki_dir) / pki.CA_CERT))
    key = pki.load_private_key(Path(pki_dir) / pki.CA_KEY)
    sig = key.sign(_message(body), ec.ECDSA(hashes.SHA256()))
    text = json.dumps({"definition": body, "signature": sig.hex()}, indent=2, sort_keys=True) + "\n"
    targets = [signed_path(pki_dir, definition.session_id)]
    if bundles_dir is not None:
        targets += [signed_path(b, definition.session_id) for b in sorted(Path(bundles_dir).iterdir())
                    if (b / pki.ROSTER).exists()]
    for t in targets:
        if t.exists():
            try:
                old = json.loads(t.read_text()).get("definition")
            except ValueError:
                old = None
            if old != body:
                raise ParameterMismatch(f"{t} already defines session {definition.session_id} otherwise; a signed "
                                        "session never changes: give the new definition another id")
    for t in targets:
        t.parent.mkdir(parents=True, exist_ok=True)
        t.write_text(text)
    return targets


def load_signed(pki_dir, session_id: str) -> SessionDefinition:
    """The definition of ``session_id`` in ``<pki_dir>/sessions/``, after the CA's signature check.

    Refused (one line, the file named): missing, not signed by the CA in
    ``<pki_dir>/ca.pem``, signed for another session id, or not a valid
    definition under the schema.
    """
    from cryptography.exceptions import InvalidSignature as _Bad
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    from . import pki

    path = signed_path(pki_dir, session_id)
    if not path.exists():
        raise MissingEnrolment(f"no signed definition of session {session_id!r} at {path}: the operator signs it "
                               "with `secure-afl session sign session.toml --pki PKI --bundles BUNDLES`")
    try:
        doc = json.loads(path.read_text())
        body, sig = doc["definition"], bytes.fromhex(doc["signature"])
        if not isinstance(body, dict):
            raise TypeError
    except (KeyError, TypeError, ValueError):
        raise InvalidSignature(f"{path} is not a signed session definition") from None
    ca = pki.load_certificate(Path(pki_dir) / pki.CA_CERT)
    try:
        ca.public_key().verify(sig, _message(body), ec.ECDSA(hashes.SHA256()))
    except _Bad:
        raise InvalidSignature(f"{path} is not signed by the consortium CA in {Path(pki_dir) / pki.CA_CERT}") from None
    if body.get("ca_sha256") != pki.cert_fingerprint(ca):
        raise InvalidSignature(f"{path} names another CA")
    if body.get("id") != session_id:
        raise WrongSession(f"{path} is signed for session {body.get('id')!r}, not {session_id!r}")
    return from_body({k: v for k, v in body.items() if k != "ca_sha256"}, source=str(path))


def from_body(body: Mapping[str, Any], *, source: str) -> SessionDefinition:
    """Re-check a canonical body under the schema (a signed body that does not normalise to itself is refused)."""
    if body.get("v") != 1:
        raise ParameterMismatch(f"{source}: unknown session definition version {body.get('v')!r}")
    sections: dict[str, dict] = {"session": {k: body[k] for k in SCHEMA["session"]
                                             if k in body and body[k] is not None}}
    try:
        sections["bounds"] = dict(body["bounds"])
        for key in ("secagg", "dp", "extractor", "split"):
            if body.get(key) is not None:
                sections[key] = {k: v for k, v in body[key].items() if v is not None}
        if "deadline" in sections["session"]:
            sections["session"]["deadline"] = _dt.datetime.fromtimestamp(body["deadline"], _dt.timezone.utc)
        again = normalise(parse(sections, source=source), source=source)
    except (KeyError, TypeError, AttributeError):
        raise ParameterMismatch(f"{source}: not a session definition") from None
    extra = set(body) - set(again.body)
    if extra or any(again.body[k] != body.get(k, _ABSENT) for k in again.body):
        bad = sorted(extra) or [k for k in again.body if again.body[k] != body.get(k, _ABSENT)]
        raise ParameterMismatch(f"{source}: the definition is not in canonical form (field {bad[0]!r})")
    return again


_ABSENT = object()


def check_info(definition: SessionDefinition, info: Mapping[str, Any], *, source: str = "the server"):
    """The parameters a party may use, after checking what ``source`` relays against the signed definition.

    Every protocol value in the server's session info (the session id, the
    parameters and their digest, backend, min_clients, min_class_count, the
    roster, the upload cap, an absolute deadline, and for secagg the client
    numbering and round limit, and the colluder bound c) must be the signed one; the first that is not
    is named. For ckks and bfv the parameters may add only the key holder's
    context hash and tag key (which its own signature covers).
    """

    if info.get("session_id") != definition.session_id:
        raise WrongSession(f"{source} serves session {info.get('session_id')!r}; the signed definition is for "
                           f"{definition.session_id!r}")
    try:
        got = SessionParams.from_dict(info["params"])
    except (KeyError, TypeError, ValueError):
        raise ParameterMismatch(f"{source} relays no session parameters") from None
    if got.digest().hex() != info.get("params_digest"):
        raise ParameterMismatch(f"{source}'s parameter digest does not match its parameters")
    expected = definition.session_params().to_dict()
    seen = got.to_dict()
    if definition.backend in ("ckks", "bfv", "split"):
        from .backends.ckks import PUBLIC_CONTEXT_KEY

        seen["backend_params"] = {k: v for k, v in seen["backend_params"].items()
                                  if k not in (PUBLIC_CONTEXT_KEY, TAG_KEY_PARAM)}
    check_same(expected, seen, what="params.", source=source)
    b = definition.body
    relayed = {"backend": info.get("backend"), "min_clients": info.get("min_clients"),
               "min_class_count": info.get("min_class_count"), "hospitals": info.get("hospitals"),
               "max_upload_bytes": info.get("max_upload_bytes"), "colluders": info.get("colluders")}
    check_same({k: b[k] for k in relayed}, relayed, what="", source=source)
    if b["deadline"] is not None and info.get("deadline") != b["deadline"]:
        check_same({"deadline": b["deadline"]}, {"deadline": info.get("deadline")}, what="", source=source)
    if b["backend"] == "secagg":
        sa = info.get("secagg") or {}
        check_same({"client_ids": definition.client_ids, "max_rounds": b["secagg"]["max_rounds"]},
                   {"client_ids": sa.get("client_ids"), "max_rounds": sa.get("max_rounds")},
                   what="secagg.", source=source)
        return definition.session_params()
    return got


def _flatten(value, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def check_same(expected: Mapping[str, Any], got: Mapping[str, Any], *, what: str, source: str) -> None:
    """Refuse, naming the first field, when ``got`` disagrees with the signed ``expected``."""
    a, b = _flatten(expected), _flatten(got)
    for field in sorted(set(a) | set(b)):
        if a.get(field, "<absent>") != b.get(field, "<absent>"):
            raise ParameterMismatch(f"{source} disagrees with the signed session definition on {what}{field}: "
                                    f"signed {a.get(field, '<absent>')!r}, got {b.get(field, '<absent>')!r}")


# ---------------------------------------------------------------------------------------------
# TOML for people
# ---------------------------------------------------------------------------------------------
_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _toml_str(s: str) -> str:
    """A TOML basic string: quote, backslash and every control character (incl. DEL) escaped."""
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif o < 0x20 or o == 0x7F:
            out.append(f"\\u{o:04X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise InvalidParameterError(f"{v!r} has no place in a session file")
        return repr(v)
    if isinstance(v, str):
        return _toml_str(v)
    if isinstance(v, _dt.datetime):
        return v.isoformat()
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise InvalidParameterError(f"cannot write {type(v).__name__} {v!r} to TOML")


def _toml_key(k: str) -> str:
    return k if _BARE.match(k) else _toml_str(k)


def write_toml(path, sections: Mapping[str, Mapping[str, Any]]) -> None:
    """Write ``{section: {key: value}}`` as TOML (strings escaped; None values left out)."""
    lines = []
    for section, values in sections.items():
        lines.append(f"[{_toml_key(section)}]")
        lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in values.items() if v is not None]
        lines.append("")
    Path(path).write_text("\n".join(lines), encoding="utf-8")
