"""``split``: two-server additive shares with validity proofs (the Prio3 / DAP shape); the server leads, the
key holder helps.

Ring and encoding: the exact two-lane fixed point of secagg and bfv (:mod:`secure_afl.hazmat.fixedpoint`),
2L lanes carried in the prime field F_p, p = 2^64 - 2^32 + 1, so that the server and the key holder can check
a proof of the upload's validity on their shares (docs/VALIDITY.md). The lanes' scale leaves room for k_max
*proven* uploads below 2^62 < p/2, so the centred sum is the integer sum and the release is the one secagg and
bfv give.

Hospital k, per upload, with a fresh 32-byte seed s_k (``w_k`` = lanes || validity bits || proofs)::

    y_k    = w_k + m_k,  m_k = expand_field(s_k)     (mod p; ChaCha20 words below p, their own domain)
    P_k    = seal(params, "contribution", y_k)      (what the server stores; it sums the lane part)
    box_k  = HPKE box of s_k to the key holder's hybrid seed key, AD = (session, params, hospital, SHA-256(P_k))
    stmt_k = Ed25519_k("split-seed" statement over session, parameters, hospital, SHA-256(P_k), box_k,
                       validity commitment)

Server (leader): ``Y = sum_k y_k`` over the manifest's cohort; it sees only words that are uniform given
anything it holds. Key holder (helper): it judges each upload's validity proof as it arrives, at a query seed
of its own; at the release, from the server-signed manifest and the signed seed statements only -- never a
masked vector -- it releases ``S = -sum_{k in cohort} m_k`` (lane part), signed over the manifest's digest,
the cohort and the uploads whose validity proof failed (left out). Release (the key holder, as
every other backend's key holder): the server signs ``Y_c``, the masked sum of exactly the cohort of the key
holder's signed statement, and the key holder forms ``Y_c + S =
sum_k enc(x_k)``, decoded.

Rooms:

* :mod:`.sizes` -- constants, sizes, the fixed-point scale, the session's parameters;
* :mod:`.statements` -- what a valid upload is, one class per circuit (plain, DP) and the Gram part;
* :mod:`.proof` -- the proof system over any statement (:class:`Circuit`), on :mod:`secure_afl.hazmat.flp`;
* :mod:`.projection` -- the random ternary projections the range bounds rest on;
* :mod:`.keys` -- the key holder's hybrid seed key and the HPKE seed boxes;
* :mod:`.signed` -- every signed message (seed statement, verifier message, share statement, evidence);
* :mod:`.roles` -- hospital, server, key holder and collector as pure functions;
* :mod:`.noise_twist` -- under DP with the Gram statement, the post-commitment signed permutation of each
  upload's noise words that both verifiers apply to their shares of the sum;
* :mod:`.pool` -- the same work over worker processes; :mod:`.driver` -- :func:`run_split`, all roles in
  memory.
"""

from .keys import *  # noqa: F401,F403
from .keys import __all__ as _keys
from .signed_messages import *  # noqa: F401,F403
from .signed_messages import __all__ as _signed
from .pool import keyholder_verdicts, leader_messages
from .proof import *  # noqa: F401,F403
from .proof import __all__ as _proof
from .roles import *  # noqa: F401,F403
from .roles import __all__ as _roles
from .sizes import *  # noqa: F401,F403
from .sizes import __all__ as _sizes
from .driver import SplitRun, default_policy, run_split
from .noise_twist import noise_permutation, noise_twist
from .gram_statement import GramStatement
from .statements import Composed, DPStatement, PlainStatement, Statement, Unlucky

__all__ = [*_keys, *_signed, *_proof, *_roles, *_sizes, "keyholder_verdicts", "leader_messages", "SplitRun",
           "default_policy", "run_split", "noise_permutation", "noise_twist", "Composed", "DPStatement", "GramStatement", "PlainStatement", "Statement",
           "Unlucky"]
