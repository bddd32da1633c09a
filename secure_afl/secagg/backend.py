"""``secagg`` behind the common ProtectionBackend interface."""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from ..protection import Combiner, ProtectionBackend
from ..envelope import open_envelope, seal
from ..exceptions import DuplicateContribution, InvalidInputError, MalformedPayload, ParameterMismatch, \
    RoundAlreadyClosed, StageError, StaleRound
from ..hazmat import fixedpoint
from ..hazmat.prg import DOMAIN_SELF_MASK, expand
from ..params import SessionParams
from .masking import add_pair_mask, pair_seed
from .messages import MaskedInput, UnmaskMaterial
from .settings import Stage, config, neighbour_graph

__all__ = ["SecAggBackend"]

class SecAggCombiner(Combiner):
    """Running sum ``S = sum_u y_u mod 2^64`` (O(L) memory) plus the set of contributors."""

    def __init__(self, backend: "SecAggBackend", allowed: Iterable[int] | None = None, round: int = 1):
        super().__init__()
        self._b = backend
        self.round = round
        self._sum = np.zeros(fixedpoint.n_words(backend.params.layout.length), dtype=np.uint64)
        self._allowed = None if allowed is None else frozenset(allowed)
        self.contributors: set[int] = set()

    def _add(self, payload) -> None:
        if isinstance(payload, MaskedInput):
            payload = payload.payload
        self._add_words(*self._b._decode_masked(payload, round=self.round))

    def _add_words(self, cid: int, words: np.ndarray) -> None:
        if self._allowed is not None and cid not in self._allowed:
            raise StageError(f"client {cid} is not expected to send a masked input")
        if cid in self.contributors:
            raise DuplicateContribution(f"client {cid} already sent its masked input")
        np.add(self._sum, words, out=self._sum)
        self.contributors.add(cid)

    def add_decoded(self, cid: int, words: np.ndarray) -> None:
        """``add`` for a payload the caller already opened with ``_decode_masked``."""
        if self._closed:
            raise RoundAlreadyClosed("combiner already produced its aggregate")
        self._add_words(cid, words)
        self.count += 1

    def _aggregate(self) -> bytes:
        return seal(self._b.params, "aggregate", self._sum.astype("<u8", copy=False).tobytes(),
                    contributors=sorted(self.contributors), round=self.round)



class SecAggBackend(ProtectionBackend):
    """``secagg`` behind the common :class:`ProtectionBackend` interface.

    * hospital: ``protect(vector, client=SecAggClient, request=MaskedInputRequest) -> bytes``
    * server:   ``combiner()`` sums masked inputs mod 2^64 (O(L) memory)
    * server:   ``reveal(aggregate, unmask=UnmaskMaterial) -> float64 vector``
    """

    name = "secagg"

    def __init__(self, params: SessionParams):
        super().__init__(params)
        self.cfg = config(params)
        self.digest_hex = params.digest().hex()

    def graph(self, graph_seed: bytes) -> dict[int, frozenset[int]]:
        """N(u) for every id, under the seed derived from the signed advertisements."""
        return neighbour_graph(self.cfg.n_parties, self.cfg.neighbours, bytes(graph_seed))

    def holders(self, u: int, graph_seed: bytes) -> frozenset[int]:
        return self.graph(graph_seed)[u] | {u}

    def protect(self, vector, *, client, request, **kw) -> bytes:
        """Hospital: the sealed masked input ``y_u`` (runs the client's MASKED_INPUT stage)."""
        # any object with the client's interface (the client module builds backends, so it is not imported here)
        if not callable(getattr(client, "masked_input", None)) or not hasattr(client, "params"):
            raise TypeError("client must be a SecAggClient")
        if client.params.digest() != self.params.digest():
            raise ParameterMismatch("the client runs other session parameters")
        return client.masked_input(request, vector).to_bytes()

    def combiner(self, *, allowed: Iterable[int] | None = None, round: int = 1, **kw) -> Combiner:
        return SecAggCombiner(self, allowed, round)

    def _decode_masked(self, payload, *, round: int | None = None) -> tuple[int, np.ndarray]:
        """``(client_id, y_u words)``; with ``round``, a masked input sealed in another round is refused."""
        env = open_envelope(self.params, payload, "contribution")
        cid = env.header.get("client_id")
        if env.header.get("stage") != Stage.MASKED_INPUT or isinstance(cid, bool) or not isinstance(cid, int):
            raise MalformedPayload("not a secagg masked input")
        if round is not None and env.header.get("round") != round:
            raise StaleRound(f"masked input of client {cid} was sealed for round {env.header.get('round')}, "
                             f"not {round}")
        if len(env.body) != 8 * fixedpoint.n_words(self.params.layout.length):
            raise MalformedPayload("masked input has the wrong length")
        return cid, np.frombuffer(env.body, dtype="<u8").astype(np.uint64)

    def unmask(self, aggregate: bytes, *, unmask: UnmaskMaterial) -> np.ndarray:
        """The exact fixed-point sum (uint64) of the survivors, masks removed (module docstring)."""
        if isinstance(unmask, Mapping):
            unmask = UnmaskMaterial.from_dict(unmask)
        if not isinstance(unmask, UnmaskMaterial):
            raise TypeError("unmask must be an UnmaskMaterial")
        env = open_envelope(self.params, aggregate, "aggregate")
        if len(env.body) != 8 * fixedpoint.n_words(self.params.layout.length):
            raise MalformedPayload("aggregate has the wrong length")
        surv = tuple(sorted(unmask.survivors))
        if env.header.get("round", 1) != unmask.round:
            raise InvalidInputError(f"unmask material is for round {unmask.round}; the aggregate for round "
                                    f"{env.header.get('round', 1)}")
        if list(surv) != env.header.get("contributors") or set(surv) & set(unmask.dropped):
            raise InvalidInputError("unmask material does not match the aggregate's contributors")
        if set(unmask.self_mask_seeds) != set(surv) or set(unmask.dropped_mask_keys) != set(unmask.dropped):
            raise InvalidInputError("unmask material is incomplete")
        total = np.frombuffer(env.body, dtype="<u8").astype(np.uint64)
        L = total.shape[0]
        for u in surv:
            np.subtract(total, expand(unmask.self_mask_seeds[u], L, domain=DOMAIN_SELF_MASK), out=total)
        sid, survivors = self.params.session_id, set(surv)
        graph = self.graph(unmask.graph_seed) if unmask.dropped else {}
        for v in sorted(unmask.dropped):
            sk = X25519PrivateKey.from_private_bytes(unmask.dropped_mask_keys[v])
            for u in sorted(graph[v] & survivors):
                seed = pair_seed(sk, unmask.mask_public_keys[u], sid, v, u, round=unmask.round)
                add_pair_mask(total, seed, u, v, remove=True)
        return total

    def reveal(self, aggregate: bytes, *, unmask: UnmaskMaterial, **kw) -> np.ndarray:
        """``dec(unmask(aggregate))``: float64 sum of the survivors' vectors."""
        return fixedpoint.decode(self.unmask(aggregate, unmask=unmask), self.cfg.frac_bits)

