"""Server side of one secagg round (no network code, no secrets until unmasking)."""

from __future__ import annotations

import logging
from typing import Iterable, Mapping

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from .._validation import check_int
from ..exceptions import (
    DuplicateContribution,
    InconsistentDealer,
    InsufficientShares,
    InvalidContribution,
    MalformedPayload,
    ParameterMismatch,
    RoundAlreadyClosed,
    SecureAFLError,
    StageError,
    StaleRound,
    WrongSession,
)
from ..hazmat import fixedpoint
from ..hazmat.shamir import Share, combine_shares
from ..params import SessionParams
from .backend import SecAggBackend, SecAggCombiner
from .masking import raw_public, share_commitment
from . import messages as msg
from .settings import ABORTED, DONE, Stage, graph_seed

__all__ = ["SecAggServerRound", "BadShare"]

logger = logging.getLogger("secure_afl.secagg")


class BadShare(tuple):
    """``(holder, owner, kind)``: a revealed share that did not match the owner's commitment (kind "b" or "s")."""

    __slots__ = ()

    def __new__(cls, holder: int, owner: int, kind: str):
        return super().__new__(cls, (holder, owner, kind))

    holder = property(lambda self: self[0])
    owner = property(lambda self: self[1])
    kind = property(lambda self: self[2])


class SecAggServerRound:
    """Server side of one secagg round (no secrets until unmasking).

    The service relays, per stage: ``request(cid)`` to every active hospital,
    their responses to ``receive(msg)``, then calls ``close_stage()`` (after
    all answered or a deadline). ``close_stage`` decides who goes on (U0, U1,
    U2, the survivors U3 and dropped D, the responders U5), logs
    ``[Stage n]`` and raises :class:`InsufficientShares` (round aborted,
    nothing revealed) when some hospital is left with fewer than ``threshold``
    share holders or fewer survivors than the consistency quorum. The UNMASK
    stage first collects the survivors' signed :class:`ConsistencyStatement`
    (``receive``); unmask requests go out once :attr:`unmask_open`. A revealed
    share that misses its commitment is discarded and listed in
    :attr:`bad_shares`. Everything the service needs (``responded``,
    ``waiting_for``, ``statements``, ``quorum``, ``advertisements``) is public. After the UNMASK stage closes, :attr:`aggregate_vector_`
    holds the revealed float64 sum and :attr:`fixed_point_sum_` the exact
    uint64 fixed-point sum.

    Parameters
    ----------
    params : SessionParams
    participants : iterable of int, optional
        Enrolled client ids (default ``1..n_parties``).
    round : int, optional
        The session's round number r (default 1), bound into every request
        and checked on every response: a message of another round is refused
        with :class:`StaleRound` and changes nothing.
    """

    def __init__(self, params: SessionParams, *, participants: Iterable[int] | None = None,
                 identity_keys: Mapping | None = None, round: int = 1):
        self.backend = SecAggBackend(params)
        self.params = params
        self.cfg = self.backend.cfg
        self._digest = params.digest().hex()
        self.round = check_int("round", round, "SecAggServerRound", low=1, high=0xFFFF)
        ids = range(1, self.cfg.n_parties + 1) if participants is None else participants
        self.participants = frozenset(check_int("participant", i, "SecAggServerRound", low=1,
                                                high=self.cfg.n_parties) for i in ids)
        self._identity_keys = None if identity_keys is None else dict(identity_keys)
        self.stage = Stage.SETUP
        self.active: frozenset[int] = self.participants
        #: the stage at which each hospital left the round (SETUP: it never joined)
        self.left_at: dict[int, str] = {}
        self._responded: set[int] = set()
        self._ads: dict[int, msg.KeyAdvertisement] = {}
        self.advertised: frozenset[int] = frozenset()
        self.graph_seed: bytes | None = None
        self._graph: dict[int, frozenset[int]] = {}
        self._inbox: dict[int, dict[int, msg.EncryptedShare]] = {}
        self._commits: dict[tuple[int, int], tuple[bytes, bytes]] = {}
        self._deals: dict[int, msg.DealRecord] = {}
        self.complaints: dict[int, msg.DealerComplaint] = {}  # dealer -> the first complaint proving it cheated
        self._combiner: SecAggCombiner | None = None
        self._aggregate: bytes | None = None
        self._unmask_lists: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self._statements: dict[int, msg.ConsistencyStatement] = {}
        self._b_shares: dict[int, list[Share]] = {}
        self._s_shares: dict[int, list[Share]] = {}
        self.bad_shares: list[BadShare] = []
        self.survivors_: tuple[int, ...] = ()
        self.dropped_: tuple[int, ...] = ()
        self.aggregate_vector_: np.ndarray | None = None
        self.fixed_point_sum_: np.ndarray | None = None

    # -- public state -------------------------------------------------------------
    @property
    def responded(self) -> frozenset[int]:
        """Who answered the current stage (for UNMASK: who sent its shares)."""
        return frozenset(self._responded)

    @property
    def waiting_for(self) -> frozenset[int]:
        """Active hospitals that have not answered the current stage yet."""
        return self.active - self._responded

    @property
    def advertisements(self) -> dict[int, msg.KeyAdvertisement]:
        """The signed key advertisements received, by client id."""
        return dict(self._ads)

    @property
    def statements(self) -> dict[int, msg.ConsistencyStatement]:
        """Signed consistency statements received in the UNMASK stage, by signer."""
        return dict(self._statements)

    def has_responded(self, client_id: int) -> bool:
        """Whether ``client_id`` answered the current stage (O(1), for polls)."""
        return client_id in self._responded

    def has_signed(self, client_id: int) -> bool:
        """Whether ``client_id`` sent its consistency statement (O(1), for polls)."""
        return client_id in self._statements

    @property
    def signed_count(self) -> int:
        return len(self._statements)

    @property
    def quorum(self) -> int:
        """Consistency statements needed before unmask requests go out (known once keys were advertised)."""
        return self.cfg.quorum

    @property
    def unmask_open(self) -> bool:
        """True once a quorum signed the survivor set: unmask requests may go out."""
        return self.stage == Stage.UNMASK and len(self._statements) >= self.quorum

    def holders(self, u: int) -> frozenset[int]:
        return self._graph[u] | {u}

    # -- requests ---------------------------------------------------------------
    def request(self, client_id: int) -> msg.MessageBase:
        """The request for ``client_id`` in the current stage."""
        self._check_open()
        if client_id not in self.active:
            raise StageError(f"client {client_id} takes no part in stage {self.stage}")
        sid, u, r = self.params.session_id, client_id, self.round
        if self.stage == Stage.SETUP:
            return msg.SetupRequest(sid, u, self._digest, r)
        if self.stage == Stage.ADVERTISE_KEYS:
            return msg.AdvertiseKeysRequest(sid, u, r)
        if self.stage == Stage.SHARE_KEYS:
            ads = tuple(self._ads[v] for v in sorted(self.advertised))
            return msg.ShareKeysRequest(sid, u, ads, self.graph_seed, r)
        if self.stage == Stage.MASKED_INPUT:
            inbox = self._inbox.get(u, {})
            senders = [v for v in sorted(inbox) if v in self.active]
            return msg.MaskedInputRequest(sid, u, tuple(inbox[v] for v in senders),
                                          tuple(self._deals[v] for v in senders), r)
        if not self.unmask_open:
            raise StageError(f"{len(self._statements)} of {self.quorum} survivors signed the survivor set so far")
        surv, drop = self._unmask_lists[u]
        # a quorum of signatures is what the hospital checks; more would only cost bytes
        signers = sorted(self._statements)[:self.quorum]
        return msg.UnmaskRequest(sid, u, surv, drop, tuple(self._statements[v] for v in signers), r)

    # -- responses --------------------------------------------------------------
    def receive(self, message) -> None:
        """Accept one hospital's response for the current stage (or its consistency statement)."""
        self._check_open()
        if isinstance(message, (bytes, bytearray, memoryview, Mapping)):
            message = msg.decode_message(message)
        if getattr(message, "STAGE", None) != self.stage:
            raise StageError(f"expect {self.stage} stage, but receive {getattr(message, 'STAGE', None)} stage")
        if message.session_id != self.params.session_id:
            raise WrongSession(f"message is for session {message.session_id!r}")
        if message.round != self.round:
            raise StaleRound(f"message is for round {message.round} of this session; round {self.round} is open")
        u = message.client_id
        if u not in self.active:
            raise StageError(f"client {u} takes no part in stage {self.stage}")
        if isinstance(message, msg.ConsistencyStatement):
            self._receive_statement(message)
            return
        if isinstance(message, msg.DealerComplaint):
            self._receive_complaint(message)
            return
        if u in self._responded:
            raise DuplicateContribution(f"client {u} already answered stage {self.stage}")
        handler = {
            Stage.SETUP: self._receive_setup, Stage.ADVERTISE_KEYS: self._receive_advertisement,
            Stage.SHARE_KEYS: self._receive_shares, Stage.MASKED_INPUT: self._receive_masked,
            Stage.UNMASK: self._receive_unmask,
        }[self.stage]
        expected = {Stage.SETUP: msg.SetupAck, Stage.ADVERTISE_KEYS: msg.KeyAdvertisement,
                    Stage.SHARE_KEYS: msg.ShareKeysResponse, Stage.MASKED_INPUT: msg.MaskedInput,
                    Stage.UNMASK: msg.UnmaskResponse}[self.stage]
        if not isinstance(message, expected):
            raise MalformedPayload(f"expected a {expected.__name__}")
        handler(message)
        self._responded.add(u)

    def _receive_setup(self, m: msg.SetupAck) -> None:
        if m.params_digest != self._digest:
            raise ParameterMismatch("the hospital runs other session parameters")

    def _check_signed(self, m, what: str) -> None:
        if self._identity_keys is not None:
            pub = self._identity_keys.get(m.client_id)
            if pub is None or not m.verify(pub):
                raise InvalidContribution(f"{what} of client {m.client_id} is not signed by its hospital")

    def _receive_advertisement(self, m: msg.KeyAdvertisement) -> None:
        if m.params_digest != self._digest:
            raise ParameterMismatch("the advertisement is for other session parameters")
        self._check_signed(m, "advertisement")
        self._ads[m.client_id] = m

    def _receive_shares(self, m: msg.ShareKeysResponse) -> None:
        u = m.client_id
        allowed = (self.holders(u) & self.advertised) - {u}
        seen = set()
        for es in m.shares:
            if es.sender != u or es.recipient not in allowed or es.recipient in seen:
                raise MalformedPayload(f"client {u} sent a share for an unexpected recipient")
            seen.add(es.recipient)
        self._check_deal(m)
        self._deals[u] = m.deal
        for es in m.shares:
            self._inbox.setdefault(es.recipient, {})[u] = es
            self._commits[(u, es.recipient)] = (es.commit_b, es.commit_s)
        self._commits[(u, u)] = (m.own_commit_b, m.own_commit_s)

    def _check_deal(self, m: msg.ShareKeysResponse) -> None:
        """The deal record is for this round and dealer, over the holders it sent shares to, with their commitments.

        A record at odds with the shares would make every holder refuse its masked input, unattributed; it is
        refused here instead, before it is relayed. Its signature and whether its holders are those the graph
        gives are each holder's checks (a hospital shown another list of advertisements deals along another
        graph)."""
        u, dl = m.client_id, m.deal
        if dl is None or (dl.session_id, dl.round, dl.params_digest, dl.dealer) != (
                self.params.session_id, self.round, self._digest, u):
            raise MalformedPayload(f"client {u} sent no deal record for this round")
        if set(dl.holders) != {es.recipient for es in m.shares} | {u} or len(dl.check) != self.cfg.threshold:
            raise MalformedPayload(f"the deal record of client {u} names other holders than its shares")
        if dl.commitment(u)[:2] != (m.own_commit_b, m.own_commit_s) or any(
                dl.commitment(es.recipient)[:2] != (es.commit_b, es.commit_s) for es in m.shares):
            raise MalformedPayload(f"the deal record of client {u} carries other commitments than its shares")

    def _receive_complaint(self, m: msg.DealerComplaint) -> None:
        """A holder's proof that the dealer of its shares cheated; the round will abort before any unmask."""
        if self.stage != Stage.MASKED_INPUT:
            raise StageError("complaints about a dealing are accepted in the masked_input stage")
        w = m.deal.dealer
        pub = None if self._identity_keys is None else self._identity_keys.get(w)
        if pub is None or not m.proves(pub, self._digest, self.cfg.threshold):
            raise InvalidContribution(f"the complaint of client {m.client_id} against client {w} proves nothing: "
                                      "its shares do not match the signed commitments or lie on the check polynomial")
        self.complaints.setdefault(w, m)
        self._responded.add(m.client_id)  # it uploads nothing; the stage need not wait for it
        logger.warning("[Stage 3] client %d proved that client %d dealt inconsistent shares", m.client_id, w)

    def _receive_masked(self, m: msg.MaskedInput) -> None:
        # checks envelope, session, parameters, round, length
        cid, words = self.backend._decode_masked(m.payload, round=self.round)
        if cid != m.client_id:
            raise MalformedPayload("masked input header names another client")
        self._combiner.add_decoded(cid, words)

    def _receive_statement(self, m: msg.ConsistencyStatement) -> None:
        if m.client_id in self._statements:
            raise DuplicateContribution(f"client {m.client_id} already signed the survivor set")
        if (m.params_digest, m.graph_seed, m.survivors) != (self._digest, self.graph_seed, self.survivors_):
            raise InvalidContribution(f"client {m.client_id} signed another survivor set")
        self._check_signed(m, "consistency statement")
        self._statements[m.client_id] = m

    def _receive_unmask(self, m: msg.UnmaskResponse) -> None:
        """Keep the shares that match their owner's commitment; name the holder of any other."""
        u = m.client_id
        if not self.unmask_open:
            raise StageError("unmask responses are accepted once a quorum signed the survivor set")
        surv, drop = self._unmask_lists[u]
        if not set(m.self_mask_shares) <= set(surv) or not set(m.mask_key_shares) <= set(drop):
            raise MalformedPayload("unmask response holds shares that were not asked for")
        good = []
        for kind, shares, store in (("b", m.self_mask_shares, self._b_shares), ("s", m.mask_key_shares, self._s_shares)):
            for owner, data in sorted(shares.items()):
                if self._share_ok(kind, owner, u, data):
                    good.append((store, owner, Share.from_bytes(data)))
                else:
                    self.bad_shares.append(BadShare(u, owner, kind))
                    logger.warning("[Stage 4] client %d revealed a %s-share of client %d that does not match the "
                                   "commitment; discarded", u, kind, owner)
        for store, owner, share in good:
            store.setdefault(owner, []).append(share)

    def _share_ok(self, kind: str, owner: int, holder: int, data: bytes) -> bool:
        commit = self._commits.get((owner, holder))
        if commit is None or not isinstance(data, bytes):
            return False
        expected = commit[0] if kind == "b" else commit[1]
        if share_commitment(self.params.session_id, self._digest, kind, owner, holder, data,
                            round=self.round) != expected:
            return False
        try:
            s = Share.from_bytes(data)
        except MalformedPayload:
            return False
        return s.index == holder and s.threshold == self.cfg.threshold and s.length == 32

    # -- stage transitions --------------------------------------------------------
    def close_stage(self) -> bool:
        """Close the current stage; True when the round is complete, raises InsufficientShares on abort."""
        self._check_open()
        try:
            done = {
                Stage.SETUP: self._close_setup, Stage.ADVERTISE_KEYS: self._close_advertise_keys,
                Stage.SHARE_KEYS: self._close_share_keys, Stage.MASKED_INPUT: self._close_masked_input,
                Stage.UNMASK: self._close_unmask,
            }[self.stage]()
        except SecureAFLError:
            self.stage = ABORTED  # forget everything share-related: an aborted round reveals nothing
            self._b_shares.clear()
            self._s_shares.clear()
            self._aggregate = None
            raise
        self._responded = set()
        return done

    def _need(self, ids, what: str) -> frozenset[int]:
        t = self.cfg.threshold
        if len(ids) < t:
            raise InsufficientShares(f"only {len(ids)} hospitals {what}; threshold is {t}: round aborted")
        return frozenset(ids)

    def _prune(self, ids: set[int], what: str) -> frozenset[int]:
        """Drop hospitals left with fewer than t share holders (repeat until stable)."""
        t = self.cfg.threshold
        ids = set(ids)
        changed = True
        while changed:
            changed = False
            for u in sorted(ids):
                if len(self.holders(u) & ids) < t:
                    ids.discard(u)
                    changed = True
        return self._need(ids, what)

    def _advance(self, nxt: str, active: frozenset[int]) -> bool:
        n = Stage.index(self.stage)
        logger.info("[Stage %d] %s closed: %d of %d hospitals go on.", n, self.stage, len(active), len(self.active))
        for u in self.active - active:
            self.left_at.setdefault(u, self.stage)
        self.active = active
        self.stage = nxt
        return False

    def _close_setup(self) -> bool:
        return self._advance(Stage.ADVERTISE_KEYS, self._need(self._responded, "acknowledged setup"))

    def _close_advertise_keys(self) -> bool:
        u1 = self._need(self._responded, "advertised keys")
        q = self.cfg.quorum
        if len(u1) < q:
            raise InsufficientShares(f"only {len(u1)} hospitals advertised keys; the consistency quorum is {q}: "
                                     "round aborted")
        self.advertised = u1
        self.graph_seed = graph_seed(self._ads[v] for v in u1)
        self._graph = self.backend.graph(self.graph_seed)
        return self._advance(Stage.SHARE_KEYS, u1)

    def _close_share_keys(self) -> bool:
        u2 = self._prune(self._responded, "shared keys")
        self._combiner = SecAggCombiner(self.backend, allowed=u2, round=self.round)
        return self._advance(Stage.MASKED_INPUT, u2)

    def _close_masked_input(self) -> bool:
        if self.complaints:  # before any unmask request: the round revealed nothing and may be retried without them
            cheats = sorted(self.complaints)
            raise InconsistentDealer(f"clients {cheats} dealt shares inconsistent with their signed check polynomial "
                                     "(proved by their holders): round aborted, nothing revealed",
                                     dealer=cheats[0], complaint=self.complaints[cheats[0]])
        t = self.cfg.threshold
        u2, u3 = self.active, frozenset(self._combiner.contributors)
        dropped = u2 - u3
        q = self.quorum
        if len(u3) < max(q, self.cfg.min_clients):
            raise InsufficientShares(f"only {len(u3)} masked inputs; the consistency quorum is {q}: round aborted, "
                                     "nothing revealed")
        for u in sorted(u2):  # every survivor's b_u and every dropped key must stay recoverable
            if len(self.holders(u) & u3) < t:
                raise InsufficientShares(
                    f"client {u} has {len(self.holders(u) & u3)} surviving share holders; threshold is {t}: "
                    "round aborted, nothing revealed"
                )
        self._aggregate = self._combiner.aggregate() if u3 else None
        self.survivors_, self.dropped_ = tuple(sorted(u3)), tuple(sorted(dropped))
        for u in u3:
            h = self.holders(u)
            self._unmask_lists[u] = (tuple(sorted(h & u3)), tuple(sorted(h & dropped)))
        return self._advance(Stage.UNMASK, u3)

    def _close_unmask(self) -> bool:
        t = self.cfg.threshold
        for owner in self.survivors_:
            if len(self._b_shares.get(owner, ())) < t:
                raise InsufficientShares(f"fewer than {t} correct self-mask shares of client {owner}: round aborted")
        for owner in self.dropped_:
            if len(self._s_shares.get(owner, ())) < t:
                raise InsufficientShares(f"fewer than {t} correct mask-key shares of client {owner}: round aborted")
        material = self.unmask_material()
        self.fixed_point_sum_ = self.backend.unmask(self._aggregate, unmask=material)
        self.aggregate_vector_ = fixedpoint.decode(self.fixed_point_sum_, self.cfg.frac_bits)
        # a survivor silent in this last stage is still in the sum (its masked input arrived): it is not
        # "dropped", which means that its input is missing
        silent = sorted(self.active - self._responded)
        logger.info("[Stage 4] unmask closed: aggregate of %d hospitals revealed (%d dropped before their masked "
                    "input; %d silent in the unmask stage, their inputs counted%s; %d wrong shares discarded).",
                    len(self.survivors_), len(self.dropped_), len(silent),
                    f": clients {', '.join(map(str, silent))}" if silent else "", len(self.bad_shares))
        self.stage = DONE
        return True

    def unmask_material(self) -> msg.UnmaskMaterial:
        """Reconstruct ``b_u`` (survivors) and ``s_v^SK`` (dropped) from the correct shares received."""
        seeds = {u: self._combine(u, self._b_shares[u], "self-mask") for u in self.survivors_}
        keys = {}
        for v in self.dropped_:
            raw = self._combine(v, self._s_shares[v], "mask-key")
            if raw_public(X25519PrivateKey.from_private_bytes(raw)) != self._ads[v].mask_public_key:
                raise InvalidContribution()
            keys[v] = raw
        need = set()
        for v in self.dropped_:
            need |= self._graph[v] & set(self.survivors_)
        pks = {u: self._ads[u].mask_public_key for u in sorted(need)}
        return msg.UnmaskMaterial(self.survivors_, self.dropped_, seeds, keys, pks, self.graph_seed, self.round)

    def _combine(self, owner: int, shares: list[Share], what: str) -> bytes:
        """The secret, or the dealer named: every share kept matched a commitment in its signed deal record.

        Shares that lie on no polynomial of degree t-1 (more than t of them), or whose polynomial is no
        32-byte secret at 0, were then dealt that way by the owner. This happens only when the off-polynomial
        shares went to holders that did not complain (its colluders): an honest holder's check would have
        stopped the round at the masked input. Unmask requests have gone out, so the round is not retried.
        """
        try:
            return combine_shares(shares)
        except InvalidContribution:
            raise InconsistentDealer(
                f"the {len(shares)} {what} shares of client {owner} returned, each matching a commitment it signed, "
                f"give no {self.cfg.threshold - 1}-degree sharing of a 32-byte secret: client {owner} dealt them; "
                "round aborted", dealer=owner) from None

    @property
    def aggregate(self) -> bytes | None:
        """The sealed masked sum (available once MASKED_INPUT closed)."""
        return self._aggregate

    def _check_open(self) -> None:
        if self.stage in (DONE, ABORTED):
            raise RoundAlreadyClosed(f"the secagg round is {self.stage}")
