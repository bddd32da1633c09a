"""Hazardous materials: the primitives under the protection backends.

.. warning::
   This is a "Hazardous Materials" package. You should ONLY use it if you're
   100% absolutely sure that you know what you're doing: these functions do
   exactly what they say and check nothing about how they are combined. Use
   :mod:`secure_afl.backends` (``protect`` / ``combine`` / ``reveal``) instead.

* :mod:`.fixedpoint` - float64 <-> Z_(2^64) fixed point with a no-wrap bound;
* :mod:`.prg`        - X25519 + HKDF-SHA256 seeds, ChaCha20 mask expansion;
* :mod:`.shamir`     - Shamir t-of-n sharing over GF(2^521 - 1);
* :mod:`.ckks`       - CKKS parameter choice, error bound and TenSEAL wrappers;
* :mod:`.flp`        - the Goldilocks field, its NTT and a fully linear proof that a shared vector is all bits;
* :mod:`.field128`   - Prio3's 128-bit field ``2^128 - 28 2^64 + 1`` as an object (FIELD128), NTT included;
* :mod:`.ternary`    - ternary projections mod p in a compiled, GIL-free kernel (numba, when installed).
"""

__all__ = ["fixedpoint", "prg", "shamir", "ckks", "flp", "field128", "ternary"]
