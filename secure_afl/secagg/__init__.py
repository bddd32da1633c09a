"""``secagg``: additive masking in Z_(2^64) (two lanes per entry) with dropout recovery, robust to a malicious server.

After Bonawitz et al. 2017 ("Practical Secure Aggregation for
Privacy-Preserving Machine Learning", semi-honest variant) with the SecAgg+
neighbour graph of Bell et al. 2020 ("Secure Single-Server Aggregation with
(Poly)Logarithmic Overhead") as an option for many hospitals.

Roles and what they see (threat model: a malicious server together with at
most ``c = threshold - 1`` colluding hospitals; no network code here):

* hospital (:class:`SecAggClient`): its own vector, its own secrets, the
  public keys of its neighbours and the shares its neighbours sent it;
* server (:class:`SecAggServerRound`): public keys, AEAD ciphertexts it
  relays, masked inputs, their mod-2^64 sum, and -- after unmasking -- the
  self-mask seeds of survivors and the mask keys of dropped hospitals, which
  together reveal only the sum of the survivors' vectors.

Protocol stages (each is one request from the server and one response from
each hospital; the hospital enforces the order, :class:`Stage`)::

    [Stage 0] SETUP           SetupRequest         -> SetupAck
    [Stage 1] ADVERTISE_KEYS  AdvertiseKeysRequest -> KeyAdvertisement (c_u^PK, s_u^PK)
    [Stage 2] SHARE_KEYS      ShareKeysRequest     -> ShareKeysResponse (AEAD(shares of b_u, s_u^SK, r_u),
                                                                       signed deal record)
    [Stage 3] MASKED_INPUT    MaskedInputRequest   -> MaskedInput (sealed y_u), or a DealerComplaint
    [Stage 4] UNMASK          survivor set         -> ConsistencyStatement (signed)
                              UnmaskRequest        -> UnmaskResponse (b-shares of survivors,
                                                                      s-shares of dropped)

Rounds. A session may run several rounds r = 1, 2, ... (a retry after an
abort). ``r`` is a field of every message, part of the signed bytes of
advertisements and survivor statements, of the sealed masked-input header,
and of the HKDF context of share keys and pairwise masks and the share AEAD
associated data and commitments (:func:`~secure_afl.secagg.masking.round_context`);
:class:`SecAggClient` and :class:`SecAggServerRound` take ``round=`` (default
1) and refuse another round's messages (:class:`StaleRound`). One client
object serves one round, so a retry always has fresh keys and self-mask seed.

Masking. Hospital u with fixed-point vector ``x_u = enc(v_u)`` (see
:mod:`secure_afl.hazmat.fixedpoint`) uploads::

    y_u = x_u + PRG(b_u) + sum_{v in N(u) cap U2, v > u} PRG(s_uv)
                         - sum_{v in N(u) cap U2, v < u} PRG(s_uv)      (mod 2^64)

with ``s_uv = HKDF(X25519(s_u^SK, s_v^PK), (session, r), {u, v})``. The server sums
``S = sum_{u in U3} y_u mod 2^64``; pairwise masks between survivors cancel.
It then reconstructs ``b_u`` for every survivor and ``s_v^SK`` for every
dropped ``v in D = U2 \\ U3`` from at least ``threshold`` Shamir shares and
computes::

    sum_{u in U3} x_u = S - sum_{u in U3} PRG(b_u)
                          - sum_{v in D} sum_{u in N(v) cap U3} sign(u, v) PRG(s_uv)

where ``sign(u, v) = +1 if v > u else -1``. Each entry travels as two 64-bit
lanes; because the declared bounds keep each lane's integer sum inside
(-2^58, 2^58) (:func:`~secure_afl.hazmat.fixedpoint.choose_frac_bits`), the
result is bit-for-bit the plaintext fixed-point sum, and its decoding is the
exact sum of the hospitals' float64 values rounded once.

Notes
-----
Guards against a malicious server, all in :class:`SecAggClient`:

* Graph. The SecAgg+ graph seed is SHA-256 over the id-sorted list of
  signed key advertisements (:func:`graph_seed`); every hospital verifies
  each signature and recomputes the seed, so the server cannot seat a
  colluder next to a chosen victim by picking the seed.
* Consistency. Each survivor signs the survivor set once and reveals shares
  only after ``q`` advertised hospitals signed that same set, with
  ``q = max(floor((n + c) / 2) + 1, min_clients + c)`` (n advertised,
  ``c = t - 1``): two different sets cannot both reach q, so no hospital has
  its self-mask and its mask key revealed. A set smaller than q or
  min_clients is never signed.
* Shares. Each dealt share carries a SHA-256 commitment; the holder checks
  what it decrypts, the server checks what is revealed and discards (and
  names the holder of) a wrong share; the round completes while t correct
  shares of every needed secret remain.
* Dealing. Each dealer signs a deal record: the commitments of every
  holder's b-, s- and blinding r-share and ``z = r + c_1 f_b + c_2 f_s``
  with weights hashed from the commitments
  (:func:`~secure_afl.secagg.masking.on_check_polynomial`). A holder checks
  the signature, its commitments and ``z(i)``; shares that miss ``z``
  make it send a :class:`DealerComplaint` instead of its masked input, a
  proof anyone can check, and the round aborts before any unmask.

``threshold`` t is chosen relative to the ``m = degree + 1`` share holders
of each hospital (``2 <= t <= m``, default ``floor(m / 2) + 1``): a larger t
tolerates more colluders, a smaller one more dropouts. With ``neighbours=k``
each hospital only masks with and shares to ``k`` neighbours of a random
Harary graph, so the cost per hospital is O(k L + k^2) for masks and shares
(plus O(n) signed advertisements and statements to verify);
:func:`recommended_neighbours` gives ``2 ceil(1.5 log2 K)`` (K = 1000 -> 30).
threat_model/THREAT_MODEL.md states the colluder bound.
"""

from .backend import SecAggBackend
from .client import SecAggClient
from .masking import share_commitment
from .messages import *  # noqa: F401,F403
from .settings import (
    PROTOCOL,
    Stage,
    consistency_quorum,
    default_threshold,
    isolation_shortfall,
    dropout_tolerance,
    graph_seed,
    max_min_clients,
    neighbour_graph,
    recommended_neighbours,
    secagg_session_params,
)
from .server import BadShare, SecAggServerRound
from .simulation import identities, simulate_round

__all__ = [
    "PROTOCOL", "Stage", "SecAggBackend", "SecAggClient", "SecAggServerRound", "BadShare", "UnmaskMaterial",
    "SetupRequest", "SetupAck", "AdvertiseKeysRequest", "KeyAdvertisement", "ShareKeysRequest", "EncryptedShare",
    "ShareKeysResponse", "MaskedInputRequest", "MaskedInput", "ConsistencyStatement", "UnmaskRequest",
    "UnmaskResponse", "DealRecord", "DealerComplaint", "decode_message", "secagg_session_params", "recommended_neighbours", "default_threshold", "isolation_shortfall",
    "dropout_tolerance", "consistency_quorum", "max_min_clients", "graph_seed", "neighbour_graph", "share_commitment", "simulate_round",
    "identities",
]
