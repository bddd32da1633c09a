"""The canonical session definition: what the operator signs, every default filled in, impossible
combinations refused; and the lines that say what a session survives."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

from secure_afl.encoding import canonical_json
from secure_afl.exceptions import InvalidParameterError, MissingEnrolment
from secure_afl.extractor import ExtractorFingerprint
from secure_afl.packing import Layout
from secure_afl.params import BACKENDS, Bounds
from secure_afl.secagg import consistency_quorum, dropout_tolerance, isolation_shortfall
from secure_afl.secagg import recommended_neighbours, secagg_session_params

from .schema import SCHEMA, default, fail, suggest

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
        b = self.body["bounds"]
        return Bounds(b["max_norm"], b["n_max"], b["k_max"])

    def dp_spec(self):
        if self.body["dp"] is None:
            return None
        from secure_afl.dp import DPSpec

        return DPSpec(**self.body["dp"])

    def split_settings(self) -> dict:
        """split: the signed ``[split]`` keys (``session sign`` writes every one, defaults resolved). A definition
        signed before it did, with no ``[split]``, keeps its meaning then: two Goldilocks lanes, no Gram
        statement (:data:`~secure_afl.split.sizes.UNSIGNED_SPLIT`)."""
        from secure_afl.split.sizes import UNSIGNED_SPLIT

        sp = self.body.get("split")
        return dict(sp) if sp else {**UNSIGNED_SPLIT, "max_share": default("split", "max_share")}

    def comparable(self) -> dict:
        """The body with split's settings as they are read (:meth:`split_settings`): what a party's own
        settings must agree with, so that a definition signed without ``[split]`` and settings that spell out
        what it means are the same session."""
        out = dict(self.body)
        if out["backend"] == "split":
            out["split"] = self.split_settings()
        return out

    def session_params(self):
        """The session's :class:`~secure_afl.params.SessionParams` before any key exists (the one derivation).

        plain and secagg: exactly the parameters every upload signs. ckks and
        bfv: the key holder's keygen adds its context hash and tag key to
        ``backend_params`` and signs the result.
        """
        from secure_afl.backends.session_params import dp_session_params

        b = self.body
        layout = Layout(b["dim"], b["classes"])
        if b["backend"] == "split":
            params = dp_session_params(self.dp_spec(), "split", b["id"], layout, b["gamma"], self.bounds(),
                                       **self.split_settings())
        elif b["backend"] != "secagg":
            params = dp_session_params(self.dp_spec(), b["backend"], b["id"], layout, b["gamma"], self.bounds(),
                                       **(b.get("ckks") or {}))
        else:
            sa = b["secagg"]
            params = dp_session_params(self.dp_spec(), "secagg", b["id"], layout, b["gamma"], self.bounds(),
                                       n_parties=len(b["hospitals"]), threshold=sa["threshold"],
                                       neighbours=sa["neighbours"] or None, min_clients=b["min_clients"])
        return params.with_extractor(b["extractor"])


def normalise(sections: Mapping[str, Mapping[str, Any]], *, issued_hospitals=None,
              source: str = "session.toml", signed: bool = False) -> SessionDefinition:
    """The canonical definition of parsed sections; refuses combinations no session can run.

    ``hospitals = []`` (or absent) means every hospital issued in the
    operator's PKI (``issued_hospitals``); the signed definition always names
    them, so n is fixed before the session starts. A split session's
    ``[split]`` is always written, its field and Gram statement resolved
    (:func:`~secure_afl.split.sizes.split_choice`), so what is signed is what
    runs; ``signed``: re-reading a signed body, whose missing ``[split]``
    keeps the meaning it had (:meth:`SessionDefinition.split_settings`).
    """

    s = dict(sections.get("session", {}))
    where = f"{source} [session]"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", s["id"]):
        raise fail(where, f"id must be letters, digits, '.', '_' or '-' (at most 64), not {s['id']!r}")
    if s["backend"] not in BACKENDS:
        raise fail(where, f"backend must be one of {', '.join(BACKENDS)}, not {s['backend']!r}"
                    f"{suggest(s['backend'], BACKENDS)}")
    hospitals = s.get("hospitals") or sorted(issued_hospitals or [])
    if not hospitals:
        raise fail(where, "hospitals is empty and no hospital is issued: name the session's hospitals")
    if len(set(hospitals)) != len(hospitals):
        raise fail(where, f"hospitals lists a hospital twice: {hospitals}")
    if issued_hospitals is not None:
        missing = sorted(set(hospitals) - set(issued_hospitals))
        if missing:
            raise MissingEnrolment(f"{where}: hospitals {missing} have no enrolment in the PKI; issue them with "
                                   "`secure-afl pki issue`")
    b = dict(sections["bounds"])
    body: dict[str, Any] = {
        "v": 1, "id": s["id"], "backend": s["backend"], "dim": s["dim"], "classes": s["classes"],
        **{k: s.get(k, default("session", k)) for k in ("gamma", "min_clients", "min_class_count", "deadline",
                                                          "deadline_s", "max_upload_bytes", "colluders",
                                                          "max_refusals")},
        "hospitals": sorted(hospitals),
        "bounds": {"max_norm": b["max_norm"], "n_max": b["n_max"], "k_max": b["k_max"]},
        "secagg": None, "dp": None, "extractor": None, "split": None,
    }
    if body["min_clients"] < 1:
        raise fail(where, f"min_clients = {body['min_clients']} must be at least 1")
    if body["min_clients"] > len(hospitals):
        raise fail(where, f"a roster of {len(hospitals)} hospitals cannot release with min_clients = "
                           f"{body['min_clients']}: the smallest roster that works has {body['min_clients']} "
                           f"hospitals (or lower min_clients to {len(hospitals)})")
    if len(hospitals) > body["bounds"]["k_max"]:
        raise fail(f"{source} [bounds]", f"k_max = {body['bounds']['k_max']} is below the {len(hospitals)} "
                                          "hospitals of the session")
    if body["deadline_s"] is not None and body["deadline"] is not None:
        raise fail(where, "give deadline or deadline_s, not both")
    sa = sections.get("secagg")
    if sa is not None and s["backend"] != "secagg":
        raise fail(source, f"[secagg] is for backend = \"secagg\", and this session runs {s['backend']}")
    if s["backend"] == "secagg":
        sa = dict(sa or {})
        body["secagg"] = {k: sa.get(k, default("secagg", k)) for k in SCHEMA["secagg"]}
    sp = sections.get("split")
    if sp is not None and s["backend"] != "split":
        raise fail(source, f"[split] is for backend = \"split\", and this session runs {s['backend']}")
    if s["backend"] == "split" and (sp is not None or not signed):
        from secure_afl.split.sizes import split_choice

        sp = dict(sp or {})
        body["split"] = {**{k: sp.get(k, default("split", k)) for k in SCHEMA["split"]},
                         **split_choice(sp.get("field"), sp.get("gram_proof"))}
    ck = sections.get("ckks")
    if ck is not None:  # only a given section enters the body: a default session signs what it signed before
        if s["backend"] != "ckks":
            raise fail(source, f"[ckks] is for backend = \"ckks\", and this session runs {s['backend']}")
        body["ckks"] = {k: ck.get(k, default("ckks", k)) for k in SCHEMA["ckks"]}
    if "dp" in sections:
        d = dict(sections["dp"])
        body["dp"] = {k: d.get(k, default("dp", k)) for k in SCHEMA["dp"]}
        if body["dp"]["min_contributors"] is None:
            body["dp"]["min_contributors"] = body["min_clients"]
        if body["dp"]["min_contributors"] > len(hospitals):
            raise fail(f"{source} [dp]", f"min_contributors = {body['dp']['min_contributors']} is above the "
                                          f"{len(hospitals)} hospitals of the session: the noise would never add up")
    if "extractor" in sections:

        fp = ExtractorFingerprint.from_dict(sections["extractor"])
        if fp.dim != body["dim"] or len(fp.classes) != body["classes"]:
            raise fail(f"{source} [extractor]", f"declares dim = {fp.dim} and {len(fp.classes)} class names; "
                                                 f"the session has dim = {body['dim']} and {body['classes']} classes")
        body["extractor"] = fp.to_dict()
    if s["backend"] == "secagg":
        _resolve_secagg(body, source)
    _resolve_colluders(body, where)
    definition = SessionDefinition(body)
    try:
        params = definition.session_params()  # every remaining impossibility (DP on a backend without it, ...)
    except InvalidParameterError as e:
        raise fail(source, str(e)) from None
    if body["backend"] == "split":
        from secure_afl.split.sizes import SOUNDNESS_BITS

        from secure_afl.split.proof import Circuit, soundness_bits

        circuit = Circuit(params)
        bits, reps = soundness_bits(circuit), circuit.reps
        if bits < SOUNDNESS_BITS:
            raise fail(f"{source} [bounds]", f"validity soundness 2^-{bits:.1f} even with {reps} repetitions of the "
                                              f"bit proof, above the 2^-{SOUNDNESS_BITS} every split session "
                                              "keeps: lower n_max, max_norm or dim, or turn [dp] off")
        # the server refuses every payload above the cap: a session whose uploads all exceed it could never release
        size = circuit.upload_bytes()
        if size > body["max_upload_bytes"]:
            raise fail(where, f"every upload of this session is {size} bytes ({size / 1e6:.1f} MB), above "
                              f"max_upload_bytes = {body['max_upload_bytes']}: the server would refuse them all; "
                              "raise max_upload_bytes, or lower dim or classes, or turn [dp] or gram_proof off")
    return definition


def split_soundness(params) -> tuple[float, int]:
    """(bits, repetitions): -log2 of the probability that an invalid split upload is accepted, against a
    prover making 2^64 hash queries, and the bit proof's repetitions that reach it."""
    from secure_afl.split.proof import Circuit, soundness_bits

    circuit = Circuit(params)
    return soundness_bits(circuit), circuit.reps


def _resolve_secagg(body: dict, source: str) -> None:
    """Fill in the threshold and degree the defaults give for this roster, so the signed values are final."""

    sa, n = body["secagg"], len(body["hospitals"])
    if n < 2:
        raise fail(f"{source} [session]", "a secagg session needs at least 2 hospitals")
    k = {-1: recommended_neighbours(n), 0: None}.get(sa["neighbours"], sa["neighbours"])
    b = body["bounds"]
    try:
        p = secagg_session_params(body["id"], Layout(body["dim"], body["classes"]), body["gamma"],
                                  Bounds(b["max_norm"], b["n_max"], b["k_max"]), threshold=sa["threshold"],
                                  neighbours=k, n_parties=n, min_clients=body["min_clients"])
    except InvalidParameterError as e:
        raise fail(f"{source} [secagg]", str(e)) from None
    sa["threshold"] = p.backend_params["threshold"]
    sa["neighbours"] = p.backend_params["neighbours"] or 0  # 0: the complete graph


def _resolve_colluders(body: dict, where: str) -> None:
    """Fill in the colluder bound c and the refusal limit; refuse a c no release could meet (q > n).

    The default c is :func:`~secure_afl.cohort.default_colluders`: privacy first, so on a small roster the
    quorum may be every hospital (signable, and printed as leaving no dropout tolerance)."""
    from secure_afl.cohort import default_colluders, quorum

    n, mc = len(body["hospitals"]), body["min_clients"]
    if body["backend"] == "secagg":
        c = body["secagg"]["threshold"] - 1  # Shamir: t - 1 colluders learn nothing from the shares
        if body["colluders"] is not None and body["colluders"] != c:
            raise fail(where, f"colluders = {body['colluders']}: a secagg session tolerates threshold - 1 = {c} "
                               "colluders; set the threshold instead")
    elif body["colluders"] is None:
        try:
            c = default_colluders(n, mc)
        except InvalidParameterError as e:
            raise fail(where, str(e)) from None
    else:
        c = body["colluders"]
    q = quorum(n, c, mc)
    # secagg's threshold checks already ran (its line says when none may drop out)
    if body["backend"] != "secagg" and q > n:
        raise fail(where, f"colluders = {c} needs a quorum no release can reach: q = max(floor((n + c) / 2) + 1, "
                           f"min_clients + c) = {q} of the n = {n} hospitals; lower colluders (at most "
                           f"{max(k for k in range(n) if quorum(n, k, mc) <= n)} here) or min_clients")
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
    from secure_afl.cohort import quorum

    b = definition.body
    n, mc = len(b["hospitals"]), b["min_clients"]
    if b["backend"] != "secagg":
        c = b["colluders"]
        q = quorum(n, c, mc)
        k = n - q
        line = (f"{k} of {n} hospitals may drop out, go silent or be refused and session {b['id']} still releases: "
                f"a release needs q = max(floor((n + c) / 2) + 1, min_clients + c) = {q} roster hospitals "
                f"(c = {c} colluders tolerated, min_clients = {mc})")
        # the ways out, each the operator's explicit trade of privacy for liveness
        fewer_c = [c2 for c2 in range(c - 1, -1, -1) if n - quorum(n, c2, mc) >= 1]
        fix = " or ".join(([f"colluders = {fewer_c[0]} (fewer colluders tolerated)"] if fewer_c else []) +
                          ([f"min_clients = {mc - 1}"] if mc > 1 else [])) or "more hospitals"
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


def secagg_shortfall(definition: SessionDefinition) -> str:
    """What a secagg session's isolation falls short of (the other backends' default for this roster and
    min_clients) and why, as a clause of its isolation line; empty where it does not fall short, and for the
    other backends. ``session sign`` prints such a line as a warning."""
    b = definition.body
    if b["backend"] != "secagg":
        return ""
    n, mc, t = len(b["hospitals"]), b["min_clients"], b["secagg"]["threshold"]
    short = isolation_shortfall(n, t, mc)
    if short is None:
        return ""
    m = b["secagg"]["neighbours"] + 1 if b["secagg"]["neighbours"] else n
    better = [t2 for t2 in range(t + 1, m + 1) if consistency_quorum(n, t2, mc) <= n
              and isolation_shortfall(n, t2, mc) is None]
    how = (f"threshold = {better[0]} reaches it" if better else
           f"no secagg threshold reaches it here (each hospital's {m} share holders allow t <= {m}): more neighbours "
           "or the complete graph (neighbours = 0) raise it" if m < n - mc + 1 else
           f"no secagg threshold reaches it here (a quorum of at most n hospitals allows t <= {n - mc + 1}): "
           "split reaches it, or a larger roster")
    return (f"; fewer than the {short[1]} a plain, ckks, bfv or split session of this roster and min_clients takes "
            f"by default: {how}")


def guarantee_lines(definition: SessionDefinition) -> list[tuple[str, str]]:
    """Every guarantee a signed session keeps, one ``(name, line)`` each: what ``session sign``, ``session
    show`` and ``server run`` print, and what the audit report shows. Each line is computed from the signed
    definition alone (the same functions the parties enforce), never restated."""
    from secure_afl.cohort import isolation_coalition, quorum

    b = definition.body
    n, mc, c = len(b["hospitals"]), b["min_clients"], b["colluders"]
    out = [("quorum", dropout_line(definition)[1])]
    t = b["secagg"]["threshold"] if b["backend"] == "secagg" else None
    k = isolation_coalition(n, c, mc, secagg_threshold=t)
    q = consistency_quorum(n, t, mc) if t is not None else quorum(n, c, mc)
    why = (f"every release needs q = {q} of the {n} hospitals" +
           (f", and {t} share holders open a hospital's masks" if t is not None and t < q - 1 else ""))
    out.append(("isolation", f"isolating one hospital's statistics takes the server and {k} colluding hospitals "
                             f"({why}); the session is signed for c = {c} colluders, so at least {q - c} honest "
                             f"hospitals (min_clients = {mc}) stand behind every release" + secagg_shortfall(definition)))
    if b["backend"] == "split":
        bits, reps = split_soundness(definition.session_params())
        out.append(("soundness", f"validity: an invalid upload is accepted with probability at most 2^-{bits:.1f} "
                                 f"against a prover making 2^64 hash queries ({reps} repetitions of the bit proof)"))
    split_on = b["backend"] == "split"
    if split_on and definition.split_settings()["gram_proof"]:
        out.append(("steering", f"validity: {split_validity(definition)}: every upload proves its statistics "
                                "positive semi-definite, so no hospital can set W exactly; it can still pull W by "
                                "its share of the samples"))
    else:
        out.append(("steering", (f"validity: {split_validity(definition)}: " if split_on else "no Gram statement: ") +
                                "one hospital that knows the others' sums can set W exactly (positive "
                                "semi-definite C_k with a chosen Q_k passes every check)" +
                                ("; sign [split] gram_proof = true to refuse it" if split_on else
                                 "; only split with gram_proof refuses it")))
    dp = b.get("dp")
    if dp:
        from secure_afl.dp.mechanism import release_epsilon

        eps = release_epsilon(definition.session_params(), int(dp["min_contributors"]))
        out.append(("dp", f"differential privacy: epsilon <= {eps:.3g}, delta = {dp['delta']:g} for the released "
                          f"aggregate (noise shares of at least min_contributors = {dp['min_contributors']} "
                          "hospitals; the key holder refuses a release with fewer)"))
    else:
        out.append(("dp", "no differential privacy: whoever receives the release learns the exact aggregate"))
    out.append(("share", share_line(definition)))
    return out


def split_validity(definition: SessionDefinition) -> str:
    """A split session's field and Gram statement as read (:meth:`SessionDefinition.split_settings`), in words:
    "Gram statement on (field128, exact lanes)", "... on (goldilocks, statistics snapped onto the factor)" or
    "Gram statement off (goldilocks)". Under [dp] the statistics are snapped in either field (the residual
    witness is not carried: the noise moves them far more), and the noise share's bound is named."""
    sp = definition.split_settings()
    if not sp["gram_proof"]:
        return f"Gram statement off ({sp['field']})"
    dp = definition.body.get("dp") is not None
    lanes = "exact lanes" if sp["field"] == "field128" and not dp else "statistics snapped onto the factor"
    if dp:
        lanes += (", noise share bounded by projection rows and its groups' l2 bounds" if sp["field"] == "field128"
                  else ", noise share bounded entry by entry")
    return f"Gram statement on ({sp['field']}, {lanes})"


def share_line(definition: SessionDefinition) -> str:
    """The largest share of the pooled samples one hospital may hold (one line): its n_max against the others,
    and the session's cap. Steering is bounded by it, whatever the upload proves (docs/VALIDITY.md)."""
    b = definition.body
    n, n_max = len(b["hospitals"]), b["bounds"]["n_max"]
    cap = definition.split_settings()["max_share"] if b["backend"] == "split" else 1.0
    line = (f"one hospital may hold up to n_max = {n_max} samples: {100.0 / n:.3g} % of the pooled statistics if "
            f"the other {n - 1} hold n_max each, all of them if they hold none")
    if cap < 1.0:
        line += (f"; capped at max_share = {cap:g}: a release needs at least {math.ceil(n_max / cap)} samples "
                 "in all")
    else:
        line += "; no cap (a split session may set [split] max_share)"
    return line
