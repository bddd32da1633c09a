"""Hospital-side secagg state machine: every check against a malicious server lives here."""

from __future__ import annotations

import secrets
from typing import Mapping

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from .._validation import check_int
from ..protection import check_vector
from ..envelope import seal
from ..exceptions import (
    InconsistentDealer,
    InsufficientShares,
    InvalidContribution,
    MalformedPayload,
    OverlappingUnmaskRequest,
    ParameterMismatch,
    SecureAFLError,
    StageError,
    StaleRound,
    WrongSession,
)
from ..hazmat import fixedpoint
from ..hazmat.prg import DOMAIN_SELF_MASK, expand
from ..hazmat.shamir import PRIME, Share, deal, evaluate, random_polynomial
from ..params import SessionParams
from .backend import SecAggBackend
from .masking import (
    add_pair_mask,
    pair_seed,
    raw_private,
    raw_public,
    share_ad,
    share_key,
    deal_challenge,
    on_check_polynomial,
    share_commitment,
)
from .messages import (
    AdvertiseKeysRequest,
    ConsistencyStatement,
    DealerComplaint,
    DealRecord,
    EncryptedShare,
    KeyAdvertisement,
    MaskedInput,
    MaskedInputRequest,
    SetupAck,
    SetupRequest,
    ShareKeysRequest,
    ShareKeysResponse,
    UnmaskRequest,
    UnmaskResponse,
    MessageBase,
)
from .settings import ABORTED, DONE, Stage, graph_seed, neighbour_graph

__all__ = ["SecAggClient"]

_NONCE_BYTES = 12
_SOFT_ERRORS = (StageError, WrongSession, ParameterMismatch, MalformedPayload, TypeError, StaleRound)


class SecAggClient:
    """Hospital-side state machine for one secagg session; it holds every guard against a malicious server.

    Each stage method takes the server's request and returns the response to
    send back; a request for any other stage than the next one raises
    :class:`StageError` and leaves the state unchanged. A request that fails a
    cryptographic or protocol check (:class:`InvalidContribution`,
    :class:`OverlappingUnmaskRequest`, :class:`InsufficientShares`) aborts the
    client for good. The guards, in order:

    * SHARE_KEYS: every advertisement carries its hospital's signature; the
      graph seed is the hash of that signed list, never the server's choice;
      at least the consistency quorum advertised;
    * MASKED_INPUT: every share decrypts under its AEAD and matches the
      dealer's commitment in its signed deal record, and lies on the
      record's check polynomial (else :class:`InconsistentDealer`, carrying
      the complaint that proves it);
    * consistency: sign only a survivor set of enrolled, advertised hospitals,
      with us in it and at least the quorum large; sign once;
    * UNMASK: a quorum of valid signatures over the ONE set we signed, a
      request that agrees with that set, and never both shares of one peer.

    Parameters
    ----------
    params : SessionParams
        secagg session parameters.
    client_id : int
        This hospital's id in ``1..n_parties`` (also its Shamir x-coordinate).
    identity_key : Ed25519PrivateKey
        This hospital's enrolled identity key (signs its advertisement and its
        consistency statement).
    identity_keys : mapping int -> Ed25519PublicKey
        The enrolled identity keys of all hospitals, by client id.
    round : int, optional
        The session's round number r (default 1). It is bound into every
        message, signature, key derivation and share AEAD; a request for
        another round is refused (:class:`StaleRound`). One object serves one
        round: a retried round needs a new one, hence fresh keys and a fresh
        self-mask seed.
    """

    def __init__(self, params: SessionParams, client_id: int, identity_key, identity_keys: Mapping, *,
                 round: int = 1):
        self.backend = SecAggBackend(params)
        self.params = params
        self.cfg = self.backend.cfg
        self.client_id = check_int("client_id", client_id, "SecAggClient", low=1, high=self.cfg.n_parties)
        if not hasattr(identity_key, "sign") or self.client_id not in identity_keys:
            raise TypeError("identity_key must be an Ed25519 private key and identity_keys must name this client")
        self.round = check_int("round", round, "SecAggClient", low=1, high=0xFFFF)
        self._identity = identity_key
        self._peers = dict(identity_keys)
        self._digest = params.digest().hex()
        self._stage = Stage.SETUP
        self._enc_sk: X25519PrivateKey | None = None
        self._mask_sk: X25519PrivateKey | None = None
        self._b: bytes | None = None
        self._own_ad: KeyAdvertisement | None = None
        self._ads: dict[int, KeyAdvertisement] = {}
        self._advertised: frozenset[int] = frozenset()
        self._graph_seed: bytes | None = None
        self._graph: dict[int, frozenset[int]] | None = None
        self._share_keys: dict[int, ChaCha20Poly1305] = {}
        self._held: dict[int, tuple[Share, Share]] = {}
        self._signed: ConsistencyStatement | None = None

    @classmethod
    def _from_parts(cls, params, client_id, identity_key, identity_keys, *, enc_private: bytes,
                    mask_private: bytes, self_mask_seed: bytes, round: int = 1):
        """Deterministic seam for tests and vectors: fixed key pairs and self-mask seed."""
        c = cls(params, client_id, identity_key, identity_keys, round=round)
        c._enc_sk = X25519PrivateKey.from_private_bytes(enc_private)
        c._mask_sk = X25519PrivateKey.from_private_bytes(mask_private)
        if len(self_mask_seed) != 32:
            raise ValueError("self_mask_seed must be 32 bytes")
        c._b = bytes(self_mask_seed)
        return c

    @property
    def stage(self) -> str:
        """The next stage this client accepts (``"done"`` / ``"aborted"`` at the end)."""
        return self._stage

    @property
    def graph_seed(self) -> bytes | None:
        """The seed this hospital derived from the signed advertisements (None before SHARE_KEYS)."""
        return self._graph_seed

    @property
    def holders(self) -> frozenset[int]:
        """H(u) = N(u) + {u}: who holds shares of this hospital's secrets (known from SHARE_KEYS on)."""
        if self._graph is None:
            raise StageError("the neighbour graph is fixed by the advertisements, at SHARE_KEYS")
        return self._graph[self.client_id] | {self.client_id}

    @property
    def quorum(self) -> int:
        """Signatures over one survivor set needed before this hospital reveals a share."""
        return self.cfg.quorum

    # -- dispatch --------------------------------------------------------------
    def handle(self, request: MessageBase, *, vector=None) -> MessageBase:
        """Answer any request (``vector`` is needed for MASKED_INPUT)."""
        stage = getattr(request, "STAGE", None)
        self._check_stage(stage)
        if stage == Stage.SETUP:
            return self.setup(request)
        if stage == Stage.ADVERTISE_KEYS:
            return self.advertise_keys(request)
        if stage == Stage.SHARE_KEYS:
            return self.share_keys(request)
        if stage == Stage.MASKED_INPUT:
            return self.masked_input(request, vector)
        return self.unmask(request)

    def _check_stage(self, received) -> None:
        if received != self._stage:
            raise StageError(
                f"Abort secure aggregation: expect {self._stage} stage, but receive {received} stage"
            )

    def _begin(self, request, cls) -> None:
        self._check_stage(getattr(request, "STAGE", None))
        if not isinstance(request, cls):
            raise TypeError(f"expected a {cls.__name__}")
        if request.session_id != self.params.session_id:
            raise WrongSession(f"request is for session {request.session_id!r}, not {self.params.session_id!r}")
        if request.client_id != self.client_id:
            raise MalformedPayload(f"request is addressed to client {request.client_id}, not {self.client_id}")
        if request.round != self.round:
            raise StaleRound(f"request is for round {request.round}; this hospital is in round {self.round}")

    def _run(self, fn, *args):
        try:
            return fn(*args)
        except _SOFT_ERRORS:
            raise
        except SecureAFLError:
            self._stage = ABORTED
            raise

    # -- stage 0 ---------------------------------------------------------------
    def setup(self, request: SetupRequest) -> SetupAck:
        """Check the session parameters; draw the key pairs and the self-mask seed."""
        self._begin(request, SetupRequest)
        digest = self.params.digest().hex()
        if request.params_digest != digest:
            raise ParameterMismatch("the server runs this session under other parameters")
        if self._enc_sk is None:
            self._enc_sk = X25519PrivateKey.generate()
            self._mask_sk = X25519PrivateKey.generate()
            self._b = secrets.token_bytes(32)
        self._stage = Stage.ADVERTISE_KEYS
        return SetupAck(self.params.session_id, self.client_id, digest, round=self.round)

    # -- stage 1 ---------------------------------------------------------------
    def advertise_keys(self, request: AdvertiseKeysRequest) -> KeyAdvertisement:
        """Publish ``c_u^PK`` and ``s_u^PK``."""
        self._begin(request, AdvertiseKeysRequest)
        self._stage = Stage.SHARE_KEYS
        return self._advertisement()

    def _advertisement(self) -> KeyAdvertisement:
        if self._own_ad is None:
            ad = KeyAdvertisement(self.params.session_id, self.client_id, self._digest, raw_public(self._enc_sk),
                                  raw_public(self._mask_sk), round=self.round)
            self._own_ad = ad.signed(self._identity)
        return self._own_ad

    # -- stage 2 ---------------------------------------------------------------
    def share_keys(self, request: ShareKeysRequest) -> ShareKeysResponse:
        """Check the signed advertisements, fix the graph from them, share ``b_u`` and ``s_u^SK`` among the holders."""
        self._begin(request, ShareKeysRequest)
        return self._run(self._share_keys_body, request)

    def _check_advertisements(self, request: ShareKeysRequest) -> dict[int, KeyAdvertisement]:
        """Every relayed advertisement is signed by its enrolled hospital, for this session and parameters."""
        u, sid = self.client_id, self.params.session_id
        ads: dict[int, KeyAdvertisement] = {}
        for ad in request.advertisements:
            if ad.session_id != sid or ad.params_digest != self._digest:
                raise WrongSession("an advertisement belongs to another session or parameters")
            if ad.round != self.round:  # keys of an aborted round may have had their mask key revealed
                raise InvalidContribution(f"the advertisement of client {ad.client_id} is from round {ad.round}, "
                                          f"not {self.round}")
            if ad.client_id in ads:
                raise MalformedPayload(f"duplicate advertisement from client {ad.client_id}")
            pub = self._peers.get(ad.client_id)
            if pub is None or not ad.verify(pub):
                raise InvalidContribution(f"advertisement of client {ad.client_id} is not signed by its hospital")
            ads[ad.client_id] = ad
        if ads.get(u) != self._advertisement():
            raise InvalidContribution()  # our own keys were not relayed faithfully
        keys = [a.enc_public_key for a in ads.values()] + [a.mask_public_key for a in ads.values()]
        if len(set(keys)) != len(keys):
            raise InvalidContribution("two relayed advertisements carry the same public key (a hospital advertised "
                                      "keys that are not its own)")
        return ads

    def _check_graph_seed(self, request: ShareKeysRequest, ads: Mapping[int, KeyAdvertisement]) -> bytes:
        """The graph seed is the hash of the signed advertisements; a server-chosen seed is refused."""
        seed = graph_seed(ads.values())
        if request.graph_seed != seed:
            raise InvalidContribution("the server's graph seed is not the hash of the signed advertisements")
        return seed

    def _check_advertised_quorum(self, ads: Mapping[int, KeyAdvertisement]) -> None:
        q = self.cfg.quorum
        if len(ads) < q:
            raise InsufficientShares(f"only {len(ads)} hospitals advertised keys; the consistency quorum is {q}")

    def _share_keys_body(self, request: ShareKeysRequest) -> ShareKeysResponse:
        u, t, sid, r = self.client_id, self.cfg.threshold, self.params.session_id, self.round
        ads = self._check_advertisements(request)
        seed = self._check_graph_seed(request, ads)
        self._check_advertised_quorum(ads)
        self._advertised, self._graph_seed = frozenset(ads), seed
        self._graph = neighbour_graph(self.cfg.n_parties, self.cfg.neighbours, seed)
        ids = sorted(self.holders & self._advertised)
        if len(ids) < t:
            raise InsufficientShares(f"only {len(ids)} share holders advertised keys; threshold is {t}")
        b_shares, f_b = deal(self._b, t, len(ids), indices=ids)
        s_shares, f_s = deal(raw_private(self._mask_sk), t, len(ids), indices=ids)
        f_r = random_polynomial(t)
        r_shares = [Share(v, evaluate(f_r, v), t, 32) for v in ids]
        commits = [(v, *(share_commitment(sid, self._digest, kind, u, v, sh.to_bytes(), round=r)
                         for kind, sh in zip("bsr", shares)))
                   for v, *shares in zip(ids, b_shares, s_shares, r_shares)]
        c1, c2 = deal_challenge(sid, self._digest, u, commits, round=r)
        check = tuple((a + c1 * b + c2 * c) % PRIME for a, b, c in zip(f_r, f_b, f_s))
        record = DealRecord(sid, r, self._digest, u, tuple(commits), check).signed(self._identity)
        out = []
        for (v, cb, cs, _cr), bs, ss, rs in zip(commits, b_shares, s_shares, r_shares):
            if v == u:
                self._held[u] = (bs, ss)
                continue
            aead = share_key(self._enc_sk, ads[v].enc_public_key, sid, u, v, round=r)
            self._share_keys[v] = aead
            nonce = secrets.token_bytes(_NONCE_BYTES)
            ct = aead.encrypt(nonce, bs.to_bytes() + ss.to_bytes() + rs.to_bytes(),
                              share_ad(sid, self._digest, u, v, cb, cs, round=r))
            out.append(EncryptedShare(u, v, nonce, ct, cb, cs))
        self._ads = {v: ads[v] for v in ids if v != u}
        own = record.commitment(u)
        self._stage = Stage.MASKED_INPUT
        return ShareKeysResponse(sid, u, tuple(out), own[0], own[1], record, round=r)

    # -- stage 3 ---------------------------------------------------------------
    def masked_input(self, request: MaskedInputRequest, vector) -> MaskedInput:
        """Decrypt the shares held for peers, then upload ``y_u`` (see the package docstring)."""
        self._begin(request, MaskedInputRequest)
        v = check_vector(self.params, vector)  # before any state change
        return self._run(self._masked_input_body, request, v)

    def _check_deal(self, es: EncryptedShare, record: DealRecord | None) -> tuple[bytes, bytes, bytes]:
        """The dealer's signed record for this round, naming us with the commitments our share carries."""
        u, w = self.client_id, es.sender
        pub = self._peers.get(w)
        if record is None or pub is None or not record.verify(pub):
            raise InvalidContribution(f"the deal record of client {w} is missing or not signed by its hospital")
        # Its session, round and dealer need no check of their own: our commitments bind them and must be in it.
        # Which other holders it names is the dealer's business: the weights hash all of their commitments.
        committed = record.commitment(u)
        if committed is None or committed[:2] != (es.commit_b, es.commit_s):
            raise InvalidContribution(f"the share of client {w} carries other commitments than its deal record")
        return committed

    def _open_share(self, es: EncryptedShare, record: DealRecord | None) -> tuple[Share, Share]:
        """Decrypt one share triple, check it against the dealer's signed commitments and check polynomial."""
        u, t, sid, r = self.client_id, self.cfg.threshold, self.params.session_id, self.round
        committed = self._check_deal(es, record)
        ad = share_ad(sid, self._digest, es.sender, u, es.commit_b, es.commit_s, round=r)
        try:
            pt = self._share_keys[es.sender].decrypt(es.nonce, es.ciphertext, ad)
        except InvalidTag:
            raise InvalidContribution() from None
        try:
            n = len(pt) // 3
            if len(pt) % 3:
                raise MalformedPayload("share triple of odd length")
            parts = [pt[:n], pt[n:2 * n], pt[2 * n:]]
            shares = [Share.from_bytes(x) for x in parts]
        except MalformedPayload:
            raise InvalidContribution() from None
        if any(sh.index != u or sh.threshold != t or sh.length != 32 for sh in shares):
            raise InvalidContribution()
        for kind, raw, commit in zip("bsr", parts, committed):
            if share_commitment(sid, self._digest, kind, es.sender, u, raw, round=r) != commit:
                raise InvalidContribution(f"client {es.sender} dealt a share that does not match its commitment")
        bs, ss, rs = shares
        if not on_check_polynomial(record.check, record.weights, u, bs.value, ss.value, rs.value):
            complaint = DealerComplaint(sid, u, record, *parts, round=r)
            raise InconsistentDealer(f"client {es.sender} dealt shares that miss its own signed check polynomial",
                                     dealer=es.sender, complaint=complaint)
        return bs, ss

    def _masked_input_body(self, request: MaskedInputRequest, vector: np.ndarray) -> MaskedInput:
        u, t, sid = self.client_id, self.cfg.threshold, self.params.session_id
        records = {}
        for record in request.deals:
            if record.dealer in records:
                raise MalformedPayload(f"two deal records of client {record.dealer}")
            records[record.dealer] = record
        received: dict[int, tuple[Share, Share]] = {}
        for es in request.shares:
            if es.recipient != u or es.sender not in self._ads or es.sender in received:
                raise MalformedPayload(f"unexpected or duplicate share from client {es.sender}")
            received[es.sender] = self._open_share(es, records.get(es.sender))
        if len(received) + 1 < t:
            raise InsufficientShares(f"only {len(received) + 1} holders completed share_keys; threshold is {t}")
        y = fixedpoint.encode(vector, self.cfg.frac_bits)
        np.add(y, expand(self._b, y.shape[0], domain=DOMAIN_SELF_MASK), out=y)
        for w in sorted(received):
            add_pair_mask(y, pair_seed(self._mask_sk, self._ads[w].mask_public_key, sid, u, w, round=self.round),
                           u, w)
        self._held.update(received)
        self._stage = Stage.UNMASK
        payload = seal(self.params, "contribution", y.astype("<u8", copy=False).tobytes(), client_id=u,
                       stage=Stage.MASKED_INPUT, round=self.round)
        return MaskedInput(sid, u, payload, self.round)

    # -- consistency check (opens stage 4) -----------------------------------------
    def sign_survivors(self, survivors) -> ConsistencyStatement:
        """Sign the survivor set the server announced, once; refuse a set too small to hide one hospital."""
        if self._stage != Stage.UNMASK:
            raise StageError(f"the survivor set is signed in the unmask stage; this client is at {self._stage}")
        surv = tuple(sorted(set(int(s) for s in survivors)))
        if self._signed is not None:
            if self._signed.survivors != surv:
                raise self._abort(InvalidContribution("the server announced a second survivor set"))
            return self._signed
        self._check_survivor_set(surv)
        self._signed = ConsistencyStatement(self.params.session_id, self.client_id, self._digest,
                                            self._graph_seed, surv, round=self.round).signed(self._identity)
        return self._signed

    def _check_survivor_set(self, surv: tuple[int, ...]) -> None:
        if self.client_id not in surv or not set(surv) <= self._advertised:
            raise self._abort(InvalidContribution("the survivor set is not a set of advertised hospitals with us in it"))
        q = self.quorum
        if len(surv) < q or len(surv) < self.cfg.min_clients:
            raise self._abort(InsufficientShares(
                f"the survivor set has {len(surv)} hospitals; the quorum is {q} and min_clients "
                f"{self.cfg.min_clients}: refusing to sign"))

    # -- stage 4 ---------------------------------------------------------------
    def unmask(self, request: UnmaskRequest) -> UnmaskResponse:
        """Reveal b-shares of survivors and key-shares of dropped peers; never both for one peer."""
        self._begin(request, UnmaskRequest)
        return self._run(self._unmask_body, request)

    def _check_consistency_quorum(self, statements) -> None:
        """At least the quorum of advertised hospitals signed the ONE set we signed; any other set is equivocation."""
        mine = self._signed
        signers = set()
        for st in statements:
            pub = self._peers.get(st.client_id)
            if st.client_id not in self._advertised or pub is None or not st.verify(pub):
                raise InvalidContribution(f"consistency statement of client {st.client_id} is not validly signed")
            if (st.session_id, st.params_digest, st.graph_seed, st.survivors, st.round) != (
                    mine.session_id, mine.params_digest, mine.graph_seed, mine.survivors, mine.round):
                raise InvalidContribution(f"client {st.client_id} signed another survivor set: the server equivocates")
            signers.add(st.client_id)
        if len(signers) < self.quorum:
            raise InsufficientShares(f"only {len(signers)} hospitals confirmed the survivor set; "
                                     f"{self.quorum} needed")

    def _unmask_body(self, request: UnmaskRequest) -> UnmaskResponse:
        u = self.client_id
        if self._signed is None:
            raise StageError("sign the survivor set before unmasking")
        self._check_consistency_quorum(request.statements)
        surv, drop = set(request.survivors), set(request.dropped)
        if len(surv) != len(request.survivors) or len(drop) != len(request.dropped):
            raise MalformedPayload("duplicate ids in the unmask request")
        if surv & drop or u in drop:
            raise OverlappingUnmaskRequest(
                "the unmask request asks for both shares of the same hospital; refusing to answer"
            )
        signed = set(self._signed.survivors)
        if not surv <= signed or drop & signed:
            raise InvalidContribution("the unmask request contradicts the signed survivor set")
        unknown = (surv | drop) - set(self._held)
        if unknown:
            raise MalformedPayload(f"no shares held for clients {sorted(unknown)}")
        self._stage = DONE
        return UnmaskResponse(
            self.params.session_id, u,
            {o: self._held[o][0].to_bytes() for o in sorted(surv)},
            {o: self._held[o][1].to_bytes() for o in sorted(drop)},
            self.round,
        )

    def _abort(self, err: SecureAFLError) -> SecureAFLError:
        self._stage = ABORTED
        return err
