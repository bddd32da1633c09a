"""secagg parameters: stages, threshold, neighbour graph, consistency quorum."""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass

from .. import domains
from .._validation import check_int, check_real, param_error
from ..exceptions import InvalidParameterError, ParameterMismatch
from ..hazmat import fixedpoint
from ..hazmat.prg import DOMAIN_GRAPH, expand
from ..packing import Layout
from ..params import Bounds, SessionParams

__all__ = ["PROTOCOL", "Stage", "recommended_neighbours", "secagg_session_params", "consistency_quorum",
           "default_threshold", "dropout_tolerance", "isolation_shortfall", "min_clients_advice",
           "max_min_clients", "graph_seed", "neighbour_graph", "config", "Config"]

PROTOCOL = "secagg/v2"
_GRAPH_PREFIX = domains.SECAGG_GRAPH_SEED

# ---------------------------------------------------------------------------
# Shared vocabulary
# ---------------------------------------------------------------------------
class Stage:
    """Protocol stages, in order (Flower's ``secaggplus_constants.Stage`` style)."""

    SETUP = "setup"
    ADVERTISE_KEYS = "advertise_keys"
    SHARE_KEYS = "share_keys"
    MASKED_INPUT = "masked_input"
    UNMASK = "unmask"
    _order = (SETUP, ADVERTISE_KEYS, SHARE_KEYS, MASKED_INPUT, UNMASK)

    def __new__(cls):  # pragma: no cover - namespace only
        raise TypeError(f"{cls.__name__} cannot be instantiated.")

    @classmethod
    def all(cls) -> tuple[str, ...]:
        return cls._order

    @classmethod
    def index(cls, stage: str) -> int:
        return cls._order.index(stage)


DONE = "done"
ABORTED = "aborted"


# ---------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------
def recommended_neighbours(n_parties: int) -> int | None:
    """Even degree ``2 ceil(1.5 log2 n)`` for the SecAgg+ graph, or None (complete graph) if that is not smaller."""
    n = check_int("n_parties", n_parties, "recommended_neighbours", low=2)
    k = 2 * math.ceil(1.5 * math.log2(n))
    return None if k >= n - 1 else k


def _degree(n_parties: int, neighbours: int | None) -> int:
    return n_parties - 1 if neighbours is None else neighbours


def default_threshold(share_holders: int, n_parties: int | None = None, min_clients: int | None = None) -> int:
    """The default Shamir threshold for ``m`` share holders per hospital (THREAT_MODEL.md 6.1: choosing t).

    Without ``n_parties``: the majority ``floor(m / 2) + 1``. With it, privacy first, as every other backend's
    default colluder bound (:func:`~secure_afl.cohort.default_colluders`): the server needs
    ``k(t) = min(q(t) - 1, t)`` colluding hospitals to learn one hospital's statistics (q - 1 to difference a
    release down to it, or t share holders to open its masks; :func:`~secure_afl.cohort.isolation_coalition`),
    and the default t is one whose k reaches ``k*``, what a plain, ckks, bfv or split session of the same roster
    and ``min_clients`` (default 2 here) takes by default. Among those t, the one that leaves the most
    hospitals free to drop out (:func:`dropout_tolerance`), and of equals the largest. Where no signable t
    reaches k* (small rosters: t <= n - min_clients + 1 caps it), the largest signable t, the most k any t
    gives; ``session sign`` then warns that this secagg session isolates with fewer colluders than the other
    backends would (:func:`isolation_shortfall`). The majority when no t >= 2 signs at all (the parameters are
    then refused, naming the ways out).

    At n = 20, min_clients = 3, 15 share holders: k* = 11, so t = 11 (quorum 16, 4 dropouts), where the
    earlier dropout-first default took t = 8 and let the server and 8 colluders open a hospital's masks.
    """
    majority = max(2, share_holders // 2 + 1)
    if n_parties is None:
        return majority
    n, m = n_parties, share_holders
    mc = 2 if min_clients is None else min_clients
    signable = [t for t in range(2, m + 1) if consistency_quorum(n, t, mc) <= n]
    if not signable:
        return majority
    target = _others_isolation(n, mc)
    reach = [t for t in signable if _isolation(n, t, mc) >= target]
    if not reach:
        return max(signable)
    return max(reach, key=lambda t: (dropout_tolerance(n, t, mc, m), t))


def _isolation(n: int, t: int, min_clients: int) -> int:
    from ..cohort import isolation_coalition

    return isolation_coalition(n, t - 1, min_clients, secagg_threshold=t)


def _others_isolation(n: int, min_clients: int) -> int:
    """k*: colluders the server needs to isolate one hospital in a plain, ckks, bfv or split session of this
    roster at its default colluder bound."""
    from ..cohort import default_colluders, isolation_coalition

    return isolation_coalition(n, default_colluders(n, min_clients), min_clients)


def isolation_shortfall(n_parties: int, threshold: int, min_clients: int) -> tuple[int, int] | None:
    """``(k, k*)`` when a secagg session with ``threshold`` isolates one hospital with fewer colluders (k) than
    the other backends' default does for the same roster (k*), else None."""
    if min_clients > n_parties:
        return None
    k, target = _isolation(n_parties, threshold, min_clients), _others_isolation(n_parties, min_clients)
    return (k, target) if k < target else None


def dropout_tolerance(n_parties: int, threshold: int, min_clients: int, share_holders: int | None = None) -> int:
    """Hospitals that may drop out or go silent, anywhere in a round, and the round still releases.

    Every stage after setup needs the consistency quorum q of the fixed n
    (advertisements, masked inputs, survivor signatures), and each hospital
    needs ``t`` of its ``m`` share holders alive: ``min(n - q, m - t)``
    (``m = n`` on the complete graph, where ``n - t >= n - q`` since
    ``q >= min_clients + t - 1 >= t``). Dropouts spread over different
    neighbourhoods may go up to ``n - q``; ``m - t`` is what holds wherever
    they fall.
    """
    m = n_parties if share_holders is None else share_holders
    q = consistency_quorum(n_parties, threshold, min_clients)
    return max(0, min(n_parties - q, m - threshold))


def consistency_quorum(n_advertised: int, threshold: int, min_clients: int) -> int:
    """Signatures over ONE survivor set a hospital needs before it reveals any share.

    With ``c = threshold - 1`` colluding hospitals (who sign anything),
    ``q = max(floor((n + c) / 2) + 1, min_clients + c)`` gives ``2 q > n + c``:
    two different sets would need ``2 (q - c) > n - c`` distinct honest
    signers, more than there are. ``q - c >= min_clients`` keeps at least
    ``min_clients`` honest hospitals behind the set that is unmasked.
    """
    from ..cohort import quorum  # the one release rule; secagg's colluders are threshold - 1

    return quorum(n_advertised, threshold - 1, min_clients)


def min_clients_advice(n_parties: int, threshold: int, min_clients: int, defaulted: bool = False) -> str:
    """Why ``min_clients`` cannot be reached under ``threshold``, and both ways out: the largest min_clients
    this threshold reaches, and the threshold that reaches this min_clients with the colluders it gives up."""
    n, t = n_parties, threshold
    which = f"threshold={t} (the default for {n} hospitals)" if defaulted else f"threshold={t}"
    text = (f"min_clients={min_clients} with {which} needs a consistency quorum of "
            f"{consistency_quorum(n, t, min_clients)} signatures from {n} hospitals: use min_clients <= "
            f"{max_min_clients(n, t)}")
    lower = n - min_clients + 1  # the largest t with max_min_clients(n, t) >= min_clients
    if lower >= 2:
        return text + (f", or set threshold = {lower} in [secagg] explicitly, which tolerates {lower - 1} colluding "
                       f"hospital{'s' if lower > 2 else ''} instead of {t - 1}")
    return text + " or enrol more hospitals"


def max_min_clients(n_parties: int, threshold: int) -> int:
    """The largest ``min_clients`` for which the consistency quorum is reachable when everybody answers."""
    return n_parties - threshold + 1


def secagg_session_params(
    session_id: str,
    layout: Layout,
    gamma: float,
    bounds: Bounds,
    *,
    threshold: int | None = None,
    neighbours: int | None = None,
    n_parties: int | None = None,
    min_clients: int | None = None,
    frac_bits: tuple | None = None,
) -> SessionParams:
    """Build and validate :class:`SessionParams` for the ``secagg`` backend.

    Parameters
    ----------
    session_id, layout, gamma, bounds
        As in :class:`~secure_afl.params.SessionParams`.
    threshold : int, optional
        Shamir threshold t, chosen relative to the ``m = degree + 1`` share
        holders of each hospital: ``2 <= t <= m``; default
        :func:`default_threshold`. The protocol tolerates ``t - 1``
        colluding hospitals next to a malicious server.
    neighbours : int, optional
        Even degree k of the SecAgg+ neighbour graph; None (default) is the
        complete graph of Bonawitz et al. A k >= n_parties - 1 is the complete
        graph and is stored as None. The graph itself is fixed by the signed
        key advertisements (:func:`graph_seed`), not by these parameters.
    n_parties : int, optional
        Number of enrolled hospitals (client ids ``1..n_parties``); default and
        maximum ``bounds.k_max`` (the no-wrap proof is for k_max summands).
    min_clients : int, optional
        The smallest survivor set the session may unmask (default 2, or 1
        where the quorum leaves no room for 2); with the colluders it
        fixes the consistency quorum (:func:`consistency_quorum`), which must
        be reachable: ``min_clients <= n_parties - t + 1``.
    frac_bits : pair of int, optional
        Fixed-point fractional bits ``(f1, f2)`` of the two lanes; default
        :func:`~secure_afl.hazmat.fixedpoint.choose_frac_bits`.
        An explicit value is checked against the no-wrap condition.
    """
    caller = "secagg_session_params"
    if not isinstance(bounds, Bounds):
        raise param_error("bounds", caller, "a Bounds", bounds)
    gamma = check_real("gamma", gamma, caller, low=0.0)
    n = bounds.k_max if n_parties is None else check_int("n_parties", n_parties, caller, low=2)
    if n < 2:
        raise InvalidParameterError(
            f"secagg needs at least 2 parties; bounds.k_max={bounds.k_max}; raise `k_max` or pass `n_parties`"
        )
    if n > bounds.k_max:
        raise InvalidParameterError(
            f"n_parties={n} exceeds bounds.k_max={bounds.k_max}; the no-wrap bound covers k_max summands: "
            "raise `k_max` in the declared bounds or enrol fewer hospitals"
        )
    if n > 0xFFFF:
        raise InvalidParameterError(f"n_parties={n} exceeds 65535; split the consortium into several sessions")
    if neighbours is not None:
        k = check_int("neighbours", neighbours, caller, low=2)
        if k >= n - 1:
            neighbours = None
        elif k % 2:
            raise InvalidParameterError(
                f"neighbours={k} must be even (random Harary graph); use neighbours={k - 1} or {k + 1}"
            )
        else:
            neighbours = k
    m = _degree(n, neighbours) + 1
    defaulted = threshold is None
    if defaulted:
        threshold = default_threshold(m, n, min_clients)
    threshold = check_int("threshold", threshold, caller, low=2)
    if threshold > m:
        where, more = ((f"n_parties={n}", "enrol more hospitals") if neighbours is None else
                       (f"the {m} share holders per hospital (neighbours={neighbours} + 1)", "raise `neighbours`"))
        raise InvalidParameterError(
            f"threshold={threshold} exceeds {where}; a hospital's secrets are shared among its share holders: "
            f"use threshold <= {m} (default {default_threshold(m)}) or {more}"
        )
    if min_clients is None:
        min_clients = max(1, min(2, max_min_clients(n, threshold)))
    min_clients = check_int("min_clients", min_clients, caller, low=1)
    if min_clients > max_min_clients(n, threshold):
        raise InvalidParameterError(min_clients_advice(n, threshold, min_clients, defaulted))
    if frac_bits is None:
        frac_bits = fixedpoint.choose_frac_bits(bounds, gamma)
    else:
        frac_bits = fixedpoint.check_frac_bits(frac_bits, bounds, gamma)
    return SessionParams(
        session_id=session_id,
        backend="secagg",
        layout=layout,
        gamma=gamma,
        bounds=bounds,
        backend_params={
            "protocol": PROTOCOL,
            "frac_bits": [int(f) for f in frac_bits],
            "n_parties": int(n),
            "threshold": int(threshold),
            "neighbours": neighbours,
            "min_clients": int(min_clients),
        },
    )


@dataclass(frozen=True)
class Config:
    """The validated secagg part of :class:`SessionParams`."""

    frac_bits: tuple
    n_parties: int
    threshold: int
    neighbours: int | None
    min_clients: int

    @property
    def colluders(self) -> int:
        """``c = t - 1``: colluding hospitals the protocol tolerates next to a malicious server."""
        return self.threshold - 1

    @property
    def quorum(self) -> int:
        """Signatures over one survivor set, counted against the FIXED n of the signed roster.

        Never against the advertisements a hospital was shown: a server that
        shows two groups two lists would otherwise give each group its own,
        smaller quorum, and two sets could both reach theirs (THREAT_MODEL 6.1).
        """
        return consistency_quorum(self.n_parties, self.threshold, self.min_clients)


def config(params: SessionParams) -> Config:
    bp = params.backend_params
    try:
        if bp.get("protocol") != PROTOCOL:
            raise ValueError
        cfg = Config(
            tuple(int(f) for f in bp["frac_bits"]), int(bp["n_parties"]), int(bp["threshold"]),
            None if bp.get("neighbours") is None else int(bp["neighbours"]), int(bp["min_clients"]),
        )
    except (KeyError, TypeError, ValueError):
        raise ParameterMismatch(
            "backend_params are not secagg parameters; build them with secagg_session_params()"
        ) from None
    # Re-run the full validation so hand-edited parameters cannot bypass it.
    again = secagg_session_params(
        params.session_id, params.layout, params.gamma, params.bounds, threshold=cfg.threshold,
        neighbours=cfg.neighbours, n_parties=cfg.n_parties, min_clients=cfg.min_clients, frac_bits=cfg.frac_bits,
    )
    if dict(again.backend_params) != dict(bp):
        raise ParameterMismatch("secagg backend_params are not in canonical form; rebuild them with secagg_session_params()")
    return cfg


def graph_seed(signed_advertisements) -> bytes:
    """SHA-256 over the canonical, id-sorted list of signed key advertisements (U1).

    Each advertisement carries fresh keys and its hospital's signature, so the
    server cannot pick the seed; every hospital that verifies the same list
    computes the same neighbour graph.
    """
    h = hashlib.sha256(_GRAPH_PREFIX)
    for ad in sorted(signed_advertisements, key=lambda a: a.client_id):
        data = ad.to_bytes()
        h.update(len(data).to_bytes(4, "big") + data)
    return h.digest()


def _permutation(n: int, seed: bytes) -> list[int]:
    """Fisher-Yates over ``1..n`` driven by ChaCha20 words (rejection sampling, no modulo bias)."""
    perm = list(range(1, n + 1))
    words = expand(seed, 2 * n + 64, domain=DOMAIN_GRAPH)
    pos = 0
    for i in range(n - 1, 0, -1):
        bound = i + 1
        limit = (1 << 64) - ((1 << 64) % bound)
        while True:
            if pos == len(words):
                words = expand(seed, 2 * len(words), domain=DOMAIN_GRAPH)
            w = int(words[pos])
            pos += 1
            if w < limit:
                break
        j = w % bound
        perm[i], perm[j] = perm[j], perm[i]
    return perm


@functools.lru_cache(maxsize=8)
def neighbour_graph(n_parties: int, neighbours: int | None, graph_seed: bytes) -> dict[int, frozenset[int]]:
    """Neighbour sets N(u) for ids ``1..n_parties``: complete, or a random Harary graph of even degree k.

    The Harary graph places the ids on a ring in the order of a public
    permutation derived from ``graph_seed`` and links each to its k/2 nearest
    ring neighbours on both sides; everybody computes the same graph.
    """
    ids = range(1, n_parties + 1)
    if neighbours is None or neighbours >= n_parties - 1:
        full = frozenset(ids)
        return {u: full - {u} for u in ids}
    perm = _permutation(n_parties, graph_seed)
    half = neighbours // 2
    graph = {}
    for i, u in enumerate(perm):
        graph[u] = frozenset(perm[(i + j) % n_parties] for j in range(-half, half + 1) if j != 0)
    return graph

