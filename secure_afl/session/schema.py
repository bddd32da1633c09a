"""The schema of ``session.toml``: every section and key, its type, default, range, readers and meaning, the
strict parser, and the reference (docs/SESSION.md) generated from it."""

from __future__ import annotations

import datetime as _dt
import difflib
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from secure_afl.exceptions import InvalidParameterError

from .toml_writer import toml_value

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
            from secure_afl.params import BACKENDS

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
        return "none" if self.default is None else toml_value(self.default)


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
                         default_text="secagg: threshold - 1; else the largest c <= min_clients - 1 whose quorum "
                                      "fits the roster (q <= n), even when no hospital may then drop out",
                         allowed="secagg: = threshold - 1; else q <= n"),
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
                                  "indefinite Gram sum: no hospital can set W exactly; false lets one that knows "
                                  "the others' sums set W (`session sign` then says so). About 9.4 MB per upload "
                                  "at d = 512, C = 100 with field128 (2.99 MB without the statement); with [dp] "
                                  "the noise share and its bound too",
                          True, "server, hospitals, key holder"),
        "field": Key("str", "the field the uploads are masked, summed and proven in: \"field128\" (one exact "
                            "16-byte word per value: the release is secagg's and bfv's bit for bit, with "
                            "gram_proof too) or \"goldilocks\" (two 8-byte lanes per value, the same bytes; "
                            "with gram_proof the statistics are snapped onto the factor, W relative 2.6e-4 at "
                            "d = 512; with [dp] the noise share's range takes per-entry bits, 41.3 MB against 9.9 "
                            "MB at d = 512, C = 100)", None, "server, hospitals, key holder",
                     default_text="\"field128\"",
                     allowed="\"goldilocks\" or \"field128\""),
        "max_share": Key("real", "largest share of the pooled samples one hospital may hold: the release is "
                                 "refused unless n_max <= max_share * n (n the released sample count)", 1.0,
                         "server, key holder", low=0.0, low_open=True, high=1.0),
    }),
    "ckks": Section("Only with backend = \"ckks\"; every key is signed (keyholder/flooding.py).", {
        "flooding": Key("str", "how the key holder's flooding of the one decryption bounds the key-dependent "
                               "error it hides: \"heuristic\" sizes it with the independence heuristic (30-bit "
                               "security against key recovery, KL 2^-32.6, under that heuristic); \"proved\" with "
                               "the honest-encryption worst case K (N/2 + 1), proved only when every hospital "
                               "encrypts honestly and still using the float64 Gaussian sampler (it drops the "
                               "independence heuristic, not those assumptions), larger noise and a larger scale "
                               "for the same precision (docs/BENCHMARKS.md gives the W cost)",
                        "heuristic", "server, hospitals, key holder", allowed="\"heuristic\" or \"proved\""),
    }),
    "secagg": Section("Only with backend = \"secagg\"; every key is signed.", {
        "threshold": Key("int", "Shamir threshold t: tolerates t - 1 colluding hospitals next to a malicious "
                                "server; the consistency quorum grows with it", None, "server, hospitals",
                         low=2, default_text="privacy first: a t whose isolation (min(q - 1, t) colluders) "
                                             "reaches the other backends' default for this roster, the one "
                                             "leaving most dropouts (then the largest); where none reaches it, "
                                             "the largest t that signs, and sign warns",
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


def suggest(word: str, known) -> str:
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(sorted(known))})"


def fail(where: str, msg: str) -> InvalidParameterError:
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
        raise fail(where, f"{key} must be {_TYPE_WORDS[kind]}, not {value!r}")
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
        raise fail(where, f"{key} must be {_TYPE_WORDS['time']}, not {value!r}") from None
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
        raise fail(where, f"{key} must be {spec.range_text()}, not {value!r}")
    return value


def default(section: str, key: str):
    d = SECTIONS[section].keys[key].default
    return list(d) if isinstance(d, list) else d


def parse(raw: Mapping[str, Any], *, source: str = "session.toml") -> dict[str, dict[str, Any]]:
    """The sections of a session file, every key known and of its type (nothing filled in yet)."""
    if not isinstance(raw, Mapping):
        raise fail(source, "is not a table of sections")
    out: dict[str, dict[str, Any]] = {}
    for section, body in raw.items():
        if section not in SCHEMA:
            raise fail(source, f"unknown section [{section}]{suggest(section, SCHEMA)}")
        if not isinstance(body, Mapping):
            raise fail(source, f"[{section}] must be a table")
        where = f"{source} [{section}]"
        known = SCHEMA[section]
        out[section] = {}
        for key, value in body.items():
            if key not in known:
                raise fail(where, f"unknown key {key!r}{suggest(key, known)}")
            out[section][key] = _ranged(where, key, SECTIONS[section].keys[key], _typed(where, key, known[key], value))
    for section, keys in _REQUIRED.items():
        if section not in ("session", "bounds") and section not in out:
            continue
        for key in keys:
            if key not in out.get(section, {}):
                raise fail(f"{source} [{section}]", f"{key} is required")
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


def reference() -> str:
    """docs/SESSION.md: every section and key of :data:`SECTIONS` (``secure-afl session reference``)."""
    from secure_afl.params import BACKENDS

    out = ["# session.toml reference", "",
           "<!-- generated from secure_afl/session/schema.py by `secure-afl session reference`; edit the schema, "
           "not this file -->", "",
           "The operator writes `session.toml` and signs it with `secure-afl session sign session.toml --pki PKI "
           "--bundles BUNDLES`; every party then reads the signed definition from its own bundle. Unknown keys, "
           "wrong types, values outside the range below and impossible combinations are refused at load, one "
           "line naming the key. Backends: " + ", ".join(f"`{x}`" for x in BACKENDS) + ".", "",
           "`session sign` prints every guarantee of the session it signs, one line each, and `server run` and "
           "`session show` print the same lines: how many hospitals may drop out or go silent with the session "
           "still releasing (plain, ckks, bfv, split: n - q with q = max(floor((n + c) / 2) + 1, min_clients + c), c "
           "the signed colluder bound; secagg: min(n - q, m - t)); how many colluding hospitals the server needs to "
           "isolate one hospital (q - 1; secagg: at most the threshold); for split the validity soundness in bits "
           "against 2^64 hash queries (a session below 64 bits is refused); whether one hospital can set W exactly "
           "(every session but split with `gram_proof`); the DP epsilon and delta; and the largest share of the "
           "pooled samples one hospital may hold (its n_max against the other hospitals at n_max each, and "
           "`[split] max_share` when set): what bounds how far one hospital can steer W (docs/VALIDITY.md).", "",
           "A split session proves the Gram statement in Field128 by default (`[split] gram_proof = true`, "
           "`field = \"field128\"`; docs/VALIDITY.md, \"The Gram statement\" and \"Exact lanes over Field128\"): "
           "every upload proves its statistics positive semi-definite, so no hospital can set W exactly, and the "
           "lanes stay exact, so the release is secagg's and bfv's bit for bit. At d = 512, C = 100 an upload is "
           "about 9.4 MB (2.99 MB in Goldilocks without the statement, 1.46 MB plain). With [dp] the field is "
           "Field128 too: the statement snaps the statistics onto its factor (far below the noise grid) and proves "
           "the statistics before the noise share, and the share within projection rows of its own and within "
           "the l2 bounds of its groups, which bound every entry within 4 tau (9.9 MB at d = 512, C = 100, against "
           "41.3 MB in Goldilocks, whose per-entry bits bound the share; docs/VALIDITY.md, \"The Gram statement "
           "with differential privacy\"). `gram_proof = false` still signs, and `session "
           "sign` then says that one hospital can set W. `session sign` writes both keys into the signed "
           "definition; a split definition signed before it did (no [split] keys) keeps meaning Goldilocks "
           "without the statement.", ""]
    for name, sec in SECTIONS.items():
        out += [f"## [{name}]", "", sec.meaning, "",
                "| key | type | default | allowed | read by | meaning |", "|---|---|---|---|---|---|"]
        for key, spec in sec.keys.items():
            cells = [f"`{key}`", _TYPE_WORDS[spec.kind], spec.default_words(), spec.range_text() or "any",
                     spec.readers, spec.meaning]
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        out.append("")
    return "\n".join(out)
