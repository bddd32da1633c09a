"""A fully linear proof of the squared norms of secret-shared vectors, one gadget: ParallelSum(Mul).

.. warning::

    Hazardous material, like :mod:`secure_afl.hazmat.flp` (whose field and NTT it uses). The recipe API is
    :mod:`secure_afl.split`.

Statement: for ``groups`` vectors ``v_1..v_G`` of ``length`` entries each, which the two verifiers hold
additively shared (each share a linear function of their upload shares), the proof's ``out_g`` outputs
are ``||v_g||^2``. The outputs are themselves linear in the proof's shares, so the caller checks them
against anything else linear (``out_g = <kappa_g, hi> / 2^t`` in the Gram statement) inside its own
random linear combination; this class checks only that the proof polynomial is the gadget's.

Gadget ``g(u) = sum_{j<c} u_j^2`` (ParallelSum of c multiplications, both inputs the same wire). Group g
occupies its own ``calls_per_group`` calls (entries past ``length`` are 0), so each output is the sum of
the gadget's values at that group's points. Wire polynomial ``U_j`` (degree < N) takes a random seed at
``a^0`` and call k's wire at ``a^(k+1)``; the proof is the c seeds and the ``2N - 1`` coefficients of
``P = sum_j U_j^2``. A verifier sends ``U_j(t)`` and ``P(t)`` for a ``t`` drawn after the proof is fixed; the
sums decide ``P(t) = sum_j U_j(t)^2``. Its shares of ``out_g`` (fixed linear functions of P's coefficients,
:meth:`SquareSumProof.outputs`) never leave it alone: the caller folds them into a random linear combination
whose value is 0 for an honest prover, since their sum would reveal ``||v_g||^2``.

Soundness: a wrong ``out_g`` share makes ``P`` differ from ``sum_j U_j^2`` at some call point, and two
distinct polynomials of degree ``<= 2N - 2`` agree on at most ``2N - 2`` of the ``p - N`` allowed ``t``.
Zero knowledge: ``t`` is off the domain, so the seed makes every ``U_j(t)`` uniform; ``P(t)`` follows.
"""

from __future__ import annotations

import numpy as np

from ..exceptions import InvalidInputError, MalformedPayload
from .fields import GOLDILOCKS, canonical
from .flp_domain import lagrange_basis, query_point

__all__ = ["SquareSumProof"]


class SquareSumProof:
    """FLP of ``out_g = ||v_g||^2`` for ``groups`` shared vectors of ``length`` entries (module docstring).

    Proof ``proof_len = c + 2N - 1`` words; verifier message ``verifier_len = c + 1``. The outputs are NOT in
    the message (their sum is ``||v_g||^2``, private): the caller checks them inside a random combination."""

    def __init__(self, length: int, groups: int, chunk: int | None = None, field=None):
        if not isinstance(length, int) or length < 1 or not isinstance(groups, int) or groups < 1:
            raise InvalidInputError("a square-sum proof covers at least one entry in at least one group")
        if chunk is None:
            best = None
            for log_n in range(1, 21):
                n = 1 << log_n
                per_group = (n - 1) // groups  # calls each group may use: G = groups * calls < n
                if per_group < 1:
                    continue
                c = -(-length // per_group)
                size = c + 2 * n - 1
                if best is None or size < best[0]:
                    best = (size, c)
            chunk = best[1]
        self.F = GOLDILOCKS if field is None else field
        self.length, self.groups, self.chunk = length, groups, int(chunk)
        self.calls_per_group = -(-length // self.chunk)
        self.calls = groups * self.calls_per_group
        n = 2
        while n <= self.calls:
            n *= 2
        self.n = n
        self.proof_len = self.chunk + 2 * n - 1
        self.verifier_len = self.chunk + 1
        self._alpha = self.F.root_of_unity(n)

    def _wires(self, v: np.ndarray) -> np.ndarray:
        """(calls, c): group g's entries in its own calls, zero-padded."""
        v = np.asarray(v, dtype=self.F.dtype).reshape(self.groups, self.length)
        padded = self.F.zeros((self.groups, self.calls_per_group * self.chunk))
        padded[:, :self.length] = v
        return padded.reshape(self.calls, self.chunk)

    def prove(self, v, seeds) -> np.ndarray:
        """The proof for the whole vectors ``v`` (groups x length, not shares); ``seeds``: c uniform elements."""
        F = self.F
        seeds = np.asarray(seeds, dtype=F.dtype).reshape(-1)
        if seeds.shape != (self.chunk,):
            raise InvalidInputError("one seed per wire")
        c, n = self.chunk, self.n
        even = F.zeros((c, n))
        even[:, 0] = seeds
        even[:, 1:self.calls + 1] = self._wires(v).T
        # P's values on the 2N-th roots: the even ones are the wires', the odd ones one N-point NTT of each
        # wire polynomial's coefficients scaled onto the coset (as in flp.BitProof)
        coset = F.scale(F.powers(F.root_of_unity(2 * n), n), F.inv(n))
        odd = F.ntt(F.mul(F.ntt(even, F.inv(self._alpha)), coset))
        prod = F.zeros(2 * n)
        prod[0::2] = F.sum_mod(F.mul(even, even), axis=0)
        prod[1::2] = F.sum_mod(F.mul(odd, odd), axis=0)
        coeffs = F.intt(prod)
        if int(F.to_ints(coeffs[-1:])[0]) != 0:  # pragma: no cover - degree <= 2N - 2 by construction
            raise AssertionError("gadget polynomial degree")
        return np.concatenate([seeds, coeffs[:-1]])

    def outputs(self, proof_share) -> np.ndarray:
        """This verifier's shares of ``out_g`` (linear in its proof share): P's sum over group g's call points
        ``a^(1 + g k + j)``, ``j < k`` (k calls per group), which for P's coefficient ``c_e`` is the geometric sum
        ``b_e^(1 + g k) S_e`` with ``b_e = a^e`` and ``S_e = sum_(j<k) b_e^j``; each group's weights are the last
        one's times ``b^k``, so G groups cost G vector products, whatever the degree."""
        F = self.F
        coeffs = self._check(proof_share, self.proof_len, "the square-sum proof share")[self.chunk:]
        b = F.powers(self._alpha, 2 * self.n - 1)
        s, term = F.ones(b.shape[0]), F.ones(b.shape[0])
        for _ in range(self.calls_per_group - 1):
            term = F.mul(term, b)
            s = F.add(s, term)
        step = F.mul(term, b)
        v = F.mul(F.mul(coeffs, b), s)
        out = []
        for _ in range(self.groups):
            out.append(F.sum_mod(v))
            v = F.mul(v, step)
        return F.to_field(out)

    def _check(self, x, n: int, what: str) -> np.ndarray:
        x = np.asarray(x, dtype=self.F.dtype).reshape(-1)
        if x.shape[0] != n:
            raise MalformedPayload(f"{what} is not {n} field elements")
        return canonical(self.F, x, what)

    def query(self, v_share, proof_share, t: int) -> np.ndarray:
        """One verifier's message ``U_j(t) ++ [P(t)]`` (linear in its shares)."""
        F = self.F
        proof_share = self._check(proof_share, self.proof_len, "the square-sum proof share")
        t = query_point(F, self.n, t)
        lag = lagrange_basis(F, self.n, self._alpha, t)
        u = self._wires(v_share)
        u_t = F.add(F.mul(proof_share[:self.chunk], lag[0:1]),
                    F.sum_mod(F.mul(u, lag[1:self.calls + 1].reshape(-1, 1)), axis=0))
        coeffs = proof_share[self.chunk:]
        return np.concatenate([u_t, F.to_field([F.poly_eval(coeffs, t)])])

    def decide(self, verifier) -> bool:
        """``P(t) = sum_j U_j(t)^2`` on the SUM of both messages (the outputs are checked by the caller)."""
        F = self.F
        v = self._check(verifier, self.verifier_len, "the square-sum verifier message")
        u_t = v[:self.chunk]
        return F.dot(u_t, u_t) == int(F.to_ints(v[-1:])[0])
