"""A malicious secagg server for tests: real hospitals' run loops talk to it over their transport.

Each hospital is a real :class:`~secure_afl.clients.hospital.HospitalClient`
(real PKI, identity keys, pinned server key) running the real
:class:`~secure_afl.clients.secagg_client.SecAggParticipant` loop; only its
``conn`` is pointed at :class:`MaliciousServer` instead of the HTTPS service.
The server keeps an honest :class:`~secure_afl.secagg.SecAggServerRound` for the
bookkeeping and deviates where a test asks it to (a chosen graph seed, two
survivor sets, a small survivor set). It also plays a colluding hospital
whose whole state it holds, and at the end tries to unmask the victim with
everything it collected.
"""

from __future__ import annotations

import base64
import hashlib
import threading
from dataclasses import replace

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from secure_afl import pki
from secure_afl.session.definition import normalise
from secure_afl.session.schema import parse
from secure_afl.session.signed import sign_definition
from secure_afl.clients.hospital import HospitalClient
from secure_afl.clients.secagg_client import SecAggParticipant
from secure_afl.exceptions import SecureAFLError
from secure_afl.hazmat import fixedpoint
from secure_afl.hazmat.prg import DOMAIN_SELF_MASK, expand
from secure_afl.hazmat.shamir import PRIME, Share, combine_shares
from secure_afl.packing import Layout
from secure_afl.params import Bounds
from secure_afl.protocol import SECAGG_CONSISTENCY, SECAGG_REQUEST_PREFIX
from secure_afl.secagg import (
    ConsistencyStatement,
    MaskedInput,
    MaskedInputRequest,
    SecAggClient,
    SecAggServerRound,
    ShareKeysRequest,
    Stage,
    UnmaskRequest,
    decode_message,
    graph_seed,
    secagg_session_params,
)
from secure_afl.secagg.masking import add_pair_mask, pair_seed, share_ad
from secure_afl.signing import make_receipt
from secure_afl.stats import local_statistics

LAYOUT = Layout(3, 2)


class _Response:
    def __init__(self, data):
        self._data = data

    def json(self):
        return self._data


class _Conn:
    """The transport a HospitalClient uses, routed to the malicious server in-process."""

    def __init__(self, server: "MaliciousServer", name: str):
        self.server, self.name = server, name

    def path(self, suffix: str = "") -> str:
        return "/s" + suffix

    def info(self) -> dict:
        return self.server.info()

    def wait_until(self, pred, *, timeout=60.0, what=""):
        return self.server.info()

    def request(self, method, path, *, body=b"", signed=True, headers=None, content=None, retry=True):
        return _Response(self.server.handle(self.name, method, path[2:], body))

    def close(self):
        pass


class MaliciousServer:
    """Honest bookkeeping plus the deviations a test switches on."""

    def __init__(self, tmp_path, n: int, *, threshold: int, min_clients: int = 2, neighbours=None,
                 colluder: int | None = None, colluders: tuple[int, ...] = (), signed_threshold: int | None = None,
                 twin: "MaliciousServer | None" = None):
        # ``twin``: the same server (its key, the same PKI and signed session) keeping a second round of the
        # session apart from the first, each hospital's second process in it
        self.names = [f"h{i}" for i in range(1, n + 1)]
        if twin is None:
            self.pki_dir = tmp_path / "pki"
            pki.init_ca(self.pki_dir)
            pki.issue(self.pki_dir, "server", "aggregator")
            for h in self.names:
                pki.issue(self.pki_dir, "hospital", h)
        else:
            self.pki_dir = twin.pki_dir
        self.ids = {h: i + 1 for i, h in enumerate(self.names)}
        self.key = Ed25519PrivateKey.generate() if twin is None else twin.key
        # what the operator signed (every hospital pins it) and what this server runs (the same unless a
        # test makes the server lie about it)
        self.definition = normalise(parse({
            "session": {"id": "adv", "backend": "secagg", "dim": LAYOUT.dim, "classes": LAYOUT.n_classes,
                        "gamma": 1.0, "min_clients": min_clients, "hospitals": self.names},
            "bounds": {"max_norm": 4.0, "n_max": 100, "k_max": n},
            "secagg": {"threshold": signed_threshold or threshold, "neighbours": neighbours or 0}}))
        if twin is None:
            sign_definition(self.definition, self.pki_dir)
        self.params = secagg_session_params("adv", LAYOUT, 1.0, Bounds(4.0, 100, n), n_parties=n,
                                            threshold=threshold, min_clients=min_clients, neighbours=neighbours)
        self.min_clients = min_clients
        keys = {self.ids[h]: pki.load_party(self.pki_dir, "hospital", h).identity_pub() for h in self.names}
        self.round = SecAggServerRound(self.params, identity_keys=keys)
        self.lock = threading.Lock()
        self.colluders = tuple(colluders) or ((colluder,) if colluder is not None else ())
        self.colluder = self.colluders[0] if self.colluders else None
        self.colluder_clients = {}
        for col in self.colluders:
            party = pki.load_party(self.pki_dir, "hospital", self.names[col - 1])
            self.colluder_clients[col] = SecAggClient(self.params, col, party.identity_key(), keys)
        self.colluder_client = self.colluder_clients.get(self.colluder)
        # deviations
        self.graph_seed: bytes | None = None  # a seed of the server's choice for SHARE_KEYS
        self.survivor_sets: dict[int, tuple[int, ...]] = {}  # per-hospital survivor set to announce
        self.forge_ad: int | None = None  # relay this client's advertisement with the server's own key
        self.ads_shown: tuple[int, ...] | None = None  # relay only these advertisements
        self.views: dict[int, tuple[int, ...]] = {}  # per-hospital advertisement list (and shares only from it)
        self.quorum_shown: dict[int, tuple[int, ...]] = {}  # hospital -> the set whose statements it is sent
        self.frame_holder: int | None = None  # the colluder deals this holder a share off its commitment
        self.ask_key_share_of: dict[int, int] = {}  # hospital -> survivor whose mask-key share it is asked
        self.hold_setup_polls = 0  # keep every hospital waiting in SETUP for this many polls
        # what the server learns
        self.share_keys_responses: dict[int, object] = {}
        self.statements: dict[int, object] = {}
        self.unmask_responses: dict[int, object] = {}
        self.masked: dict[int, np.ndarray] = {}
        self.refused: dict[str, BaseException] = {}
        self.polls: dict[int, int] = {}

    def info(self) -> dict:
        """The session info this server relays (its own parameters, whatever the operator signed)."""
        return {"session_id": "adv", "status": "open", "backend": "secagg", "params": self.params.to_dict(),
                "params_digest": self.params.digest().hex(), "min_clients": self.min_clients,
                "min_class_count": 5, "hospitals": list(self.names), "deadline": None,
                "max_upload_bytes": 64_000_000, "colluders": self.definition.body["colluders"],
                "server_identity_pub": pki.public_key_hex(self.key.public_key()),
                "secagg": {"client_ids": dict(self.ids), "max_rounds": 3, "round": 1}}

    # -- the hospitals -------------------------------------------------------------------------
    def hospitals(self, data: dict, refused: dict) -> dict[str, SecAggParticipant]:
        """Each honest hospital as its command runs it: pinned definition, fetch_params, the participant."""
        out = {}
        for h in self.names:
            if self.ids[h] in self.colluders:
                continue
            party = pki.load_party(self.pki_dir, "hospital", h)
            site = HospitalClient("https://127.0.0.1:9", "adv", party, server_identity_pub=self.key.public_key())
            site.conn.close()
            site.conn = _Conn(self, h)
            X, y = data[h]
            try:
                out[h] = SecAggParticipant(site, site.fetch_params(), local_statistics(X, y, LAYOUT.n_classes))
            except SecureAFLError as e:  # refused before the round: nothing of it reaches the server
                refused[h] = e
        return out

    def run(self, data: dict, *, timeout: float = 30.0, pause_before: str | None = None, resume: bool = False) -> dict:
        """Every honest hospital's run loop in its own thread; returns {name: receipt, None (paused at
        ``pause_before``) or exception}. ``resume``: the same participants as the last call, from where they
        paused."""
        results: dict = {}
        parts = self.participants if resume else self.hospitals(data, results)
        self.participants = parts

        def go(h, p):
            try:
                results[h] = p.run(timeout=timeout, poll=0.01, pause_before=pause_before)
            except BaseException as e:  # the verdict of each hospital is what the test measures
                results[h] = e

        threads = [threading.Thread(target=go, args=item, daemon=True) for item in parts.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout + 10)
        return results

    # -- the routes ----------------------------------------------------------------------------
    def handle(self, name: str, method: str, path: str, body: bytes):
        with self.lock:
            cid = self.ids[name]
            if method == "GET" and path == "/secagg/request":
                return self._request(cid)
            if method == "POST" and path == "/uploads":
                self.round.receive(MaskedInput.from_bytes(body))
                self.masked[cid] = self.round.backend._decode_masked(body)[1]
                self._progress()
                return make_receipt(self.key, "adv", name, hashlib.sha256(body).digest(), cid)
            stage = path.rsplit("/", 1)[1]
            msg = decode_message(body)
            if stage == SECAGG_CONSISTENCY:
                self.statements[cid] = msg
                return {"accepted": True}
            if stage == Stage.UNMASK:
                self.unmask_responses[cid] = msg
                return {"accepted": True}
            if stage == Stage.SHARE_KEYS:
                self.share_keys_responses[cid] = msg
            self.round.receive(msg)
            self._progress()
            return {"accepted": True}

    def _signed(self, stage: str, message) -> dict:
        raw = message.to_bytes()
        return {"stage": stage, "request": base64.b64encode(raw).decode(),
                "signature": self.key.sign(SECAGG_REQUEST_PREFIX + raw).hex()}

    def _request(self, cid: int) -> dict:
        r = self.round
        stage = r.stage
        if stage in ("done", "aborted"):
            return {"stage": stage}
        if stage != Stage.UNMASK:
            if cid in r.responded:
                self.polls[cid] = self.polls.get(cid, 0) + 1
                if stage == Stage.SETUP and not r.waiting_for and min(self.polls.values()) >= self.hold_setup_polls \
                        and len(self.polls) == len(r.active):
                    r.close_stage()
                return {"stage": stage, "waiting": True}
            return self._signed(stage, self._deviate(r.request(cid)))
        # unmask: the survivor set this hospital is shown, then its unmask request
        surv = self.survivor_sets.get(cid, r.survivors_)
        if cid in self.unmask_responses:
            return {"stage": "done"}  # what the server does with the shares is its business
        if cid not in self.statements:
            return {"stage": SECAGG_CONSISTENCY, "survivors": list(surv)}
        seed = self._seed_shown(cid)
        shown = tuple(self.quorum_shown.get(cid, surv))  # genuine statements, perhaps over another set
        signed = [s for s in self.statements.values() if (s.survivors, s.graph_seed) == (shown, seed)]
        signed += [self._colluder_statement(col, shown, seed) for col in self.colluders]
        if len(signed) < self._wanted(shown):
            return {"stage": stage, "waiting": True}
        dropped = set(r.survivors_) - set(surv)
        if cid in self.ask_key_share_of:  # call a signed survivor "dropped" in this hospital's request
            dropped.add(self.ask_key_share_of[cid])
        holders = r.holders(cid)
        if cid in self.views:  # ask only for hospitals that dealt to this one
            holders = holders & ({v for v in r._inbox.get(cid, {}) if v in self.views[cid]} | {cid})
        req = UnmaskRequest("adv", cid, tuple(sorted(holders & (set(surv) - dropped))), tuple(sorted(holders & dropped)),
                            tuple(sorted(signed, key=lambda s: s.client_id)))
        return self._signed(stage, req)

    def _seed_shown(self, cid: int) -> bytes:
        view = self.views.get(cid)
        if view is None:
            return self.round.graph_seed
        return graph_seed([a for v, a in self.round.advertisements.items() if v in view])

    def _deviate(self, req):
        if isinstance(req, MaskedInputRequest) and req.client_id in self.views:
            view = self.views[req.client_id]  # shares only from the hospitals this one was shown
            return replace(req, shares=tuple(es for es in req.shares if es.sender in view))
        if not isinstance(req, ShareKeysRequest):
            return req
        ads = req.advertisements
        if self.ads_shown is not None:
            ads = tuple(a for a in ads if a.client_id in self.ads_shown)
        if req.client_id in self.views:
            ads = tuple(a for a in ads if a.client_id in self.views[req.client_id])
        if self.forge_ad is not None:
            own = X25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
            ads = tuple(replace(a, enc_public_key=own) if a.client_id == self.forge_ad else a for a in ads)
        seed = graph_seed(ads) if ads != req.advertisements else req.graph_seed  # consistent with what it shows
        return replace(req, advertisements=ads, graph_seed=self.graph_seed or seed)

    def _frame(self, resp):
        """Re-encrypt the share for ``frame_holder`` with a wrong b-share under the honest commitments."""
        col, v = self.colluder_client, self.frame_holder
        shares = []
        for es in resp.shares:
            if es.recipient == v:
                ad = share_ad("adv", self.params.digest().hex(), es.sender, v, es.commit_b, es.commit_s)
                pt = col._share_keys[v].decrypt(es.nonce, es.ciphertext, ad)
                n = len(pt) // 3  # b-, s- and r-share, in that order
                bs = Share.from_bytes(pt[:n])
                wrong = Share(bs.index, (bs.value + 1) % PRIME, bs.threshold, bs.length).to_bytes()
                es = replace(es, ciphertext=col._share_keys[v].encrypt(es.nonce, wrong + pt[n:], ad))
            shares.append(es)
        return replace(resp, shares=tuple(shares))

    def _colluder_statement(self, col: int, surv: tuple[int, ...], seed: bytes):
        """A colluder signs whatever set (and graph seed) the server needs."""
        key = pki.load_party(self.pki_dir, "hospital", self.names[col - 1]).identity_key()
        return ConsistencyStatement("adv", col, self.params.digest().hex(), seed, surv).signed(key)

    def _wanted(self, surv) -> int:
        """Statements the server waits for before asking to unmask: every honest signer of that set."""
        honest = [c for c in self.ids.values() if c not in self.colluders and c in self.round.survivors_]
        return sum(1 for c in honest if tuple(self.survivor_sets.get(c, self.round.survivors_)) == tuple(surv)) + \
            sum(1 for c in self.colluders if c in self.round.survivors_)

    def _progress(self) -> None:
        """Play the colluder's part, then close the stage once every active hospital answered."""
        r = self.round
        for col in self.colluders:
            if col not in r.active or col in r.responded or r.stage == Stage.UNMASK:
                continue
            req = self._deviate(r.request(col))
            if self.ads_shown is not None and r.stage == Stage.SHARE_KEYS:
                req = r.request(col)
            resp = self.colluder_clients[col].handle(req, vector=np.zeros(LAYOUT.length))
            if r.stage == Stage.SHARE_KEYS and self.frame_holder is not None:
                resp = self._frame(resp)
            if r.stage == Stage.MASKED_INPUT:
                self.masked[col] = r.backend._decode_masked(resp.to_bytes())[1]
            if r.stage == Stage.SHARE_KEYS:
                self.share_keys_responses[col] = resp
            r.receive(resp)
        if not r.waiting_for and not (r.stage == Stage.SETUP and self.hold_setup_polls):
            r.close_stage()

    # -- the measurement -----------------------------------------------------------------------
    def try_unmask(self, victim: int) -> np.ndarray | None:
        """The victim's fixed-point vector if the shares collected reveal both b_v and s_v^SK, else None."""
        t = self.round.cfg.threshold
        b, s = [], []
        for col in self.colluder_clients.values():
            if victim in col._held:
                b.append(col._held[victim][0])
                s.append(col._held[victim][1])
        for resp in self.unmask_responses.values():
            if victim in resp.self_mask_shares:
                b.append(Share.from_bytes(resp.self_mask_shares[victim]))
            if victim in resp.mask_key_shares:
                s.append(Share.from_bytes(resp.mask_key_shares[victim]))
        b = list({x.index: x for x in b}.values())
        s = list({x.index: x for x in s}.values())
        if len(b) < t or len(s) < t or victim not in self.masked:
            return None
        try:
            seed, sk = combine_shares(b), X25519PrivateKey.from_private_bytes(combine_shares(s))
        except SecureAFLError:
            return None
        y = self.masked[victim].copy()
        np.subtract(y, expand(seed, y.shape[0], domain=DOMAIN_SELF_MASK), out=y)
        ads = self.round.advertisements
        partners = self.round.holders(victim) - {victim}
        if victim in self.views:  # it masked with the hospitals it was shown
            partners &= set(self.views[victim])
        for w in sorted(partners):
            add_pair_mask(y, pair_seed(sk, ads[w].mask_public_key, "adv", victim, w), victim, w, remove=True)
        return y

    def victim_fixed_point(self, victim: int) -> np.ndarray:
        return fixedpoint.encode(self.participants[self.names[victim - 1]].vector, self.round.cfg.frac_bits)


def hospital_data(names, seed: int = 0) -> dict:
    """Six samples per hospital, each row of norm <= 3 (the session's bound is 4)."""
    rng = np.random.default_rng(seed)
    out = {}
    for h in names:
        X = rng.standard_normal((6, LAYOUT.dim))
        X /= np.maximum(1.0, np.linalg.norm(X, axis=1, keepdims=True) / 3.0)
        out[h] = (X, rng.integers(0, LAYOUT.n_classes, 6))
    return out
