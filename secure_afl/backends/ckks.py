"""``ckks``: CKKS homomorphic encryption (TenSEAL) of the packed statistics.

Roles (threat model in ``threat_model/``):

* key holder: :func:`new_ckks_session` (or :func:`ckks_session_params`,
  :func:`generate_keys`, :func:`bind_public_context`) creates the session
  parameters and a FRESH key pair; publishes ``params`` and the public
  context; keeps the secret context, at rest only sealed by
  :func:`save_secret_context`; decrypts only the aggregate with
  :meth:`CKKSBackend.reveal`. Sees: the aggregate.
* hospital: ``CKKSBackend(params).protect(vector, public_context=pub)``.
  Sees: its own statistics.
* server: ``CKKSBackend(params).combiner(public_context=pub)``; adds
  ciphertexts it cannot read, streaming (holds one running sum of
  ``ceil(L / (N/2))`` ciphertexts). Refuses a context that holds a secret key.
  Sees: ciphertexts, sizes, who uploaded.

Binding: ``params.backend_params`` carries the CKKS parameters and
``public_context_sha256``; both enter :meth:`SessionParams.digest`, which every
payload header carries, so a payload made under another key or other
parameters is refused by :func:`~secure_afl.envelope.open_envelope`
(:class:`ParameterMismatch`) before its body is parsed. Ciphertexts are then
checked one by one (level, scale, size) under the session's context.

Precision (see :mod:`secure_afl.hazmat.ckks` for the derivation): for K
contributions whose largest entries sum to M, every revealed entry satisfies
with overwhelming probability::

    |reveal - sum| <= 7.55 sqrt(K (N/24) (2 + (2N/3)(ln(N/2) + 30 ln 2))) / 2^s + 2^-46 M

e.g. 1.6e-7 + 1.4e-14 M at N = 8192, s = 40 for K = 10. That is the bare
decryption, which never leaves the key holder: what it releases is flooded in
the coefficient domain before decoding (``keyholder/flooding.py``), and the
session's precision target ``max_abs_error`` bounds the value-independent part
of THAT release's per-entry error at K = k_max.

Notes
-----
* ckks assumes hospitals encrypt honestly: the flooding covers the error of
  fresh encryptions, and a hospital that adds multiples of an encryption of
  zero to its upload amplifies it (threat model R4); use split or bfv where
  hospitals may craft ciphertexts.
* CKKS ciphertexts are malleable and carry no proof of range: a hospital that
  encrypts values outside the declared bound (or under another key with the
  same parameters) corrupts the sum and the server cannot tell. The honest
  hospital's :meth:`protect` refuses out-of-bound vectors
  (:class:`BoundsExceeded`) because an overflow decrypts to garbage with no
  error; :meth:`reveal` refuses an aggregate that lands outside the declared
  bound (:class:`SanityCheckFailed`), which catches wraps, not every lie.
* The envelope is not authenticated: anyone can seal a single contribution as
  an "aggregate". The key holder therefore never decrypts an aggregate it did
  not form itself from ``min_clients`` signed uploads (``keyholder/``).
* Python cannot wipe memory; the secret context bytes live until collected.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .. import domains
from .._io import write_file
from ..envelope import open_envelope, seal
from ..exceptions import (
    InvalidParameterError,
    MalformedPayload,
    ParameterMismatch,
    SanityCheckFailed,
)
from ..hazmat import ckks as hz
from ..hazmat.at_rest import open_secret, seal_secret
from ..packing import Layout
from ..params import Bounds, SessionParams
from ..protection import Combiner, ProtectionBackend, check_vector

__all__ = [
    "CKKSBackend",
    "CKKSKeyPair",
    "ckks_session_params",
    "generate_keys",
    "bind_public_context",
    "new_ckks_session",
    "ckks_parameters",
    "count_breaks",
    "expected_abs_error",
    "save_secret_context",
    "load_secret_context",
    "PUBLIC_CONTEXT_KEY",
]

PUBLIC_CONTEXT_KEY = "public_context_sha256"
_AD_PREFIX = domains.CKKS_SECRET_CONTEXT_AD


@dataclass(frozen=True, repr=False)
class CKKSKeyPair:
    """A session's key material. ``secret_context`` never leaves the key holder."""

    secret_context: bytes
    public_context: bytes

    def __repr__(self) -> str:  # never print key bytes
        return f"CKKSKeyPair(public_context_sha256={hz.context_sha256(self.public_context)[:16]}..., secret=<hidden>)"


# -- session setup (key holder) -----------------------------------------------------
#: Default per-entry error target of a ckks session's FLOODED release at K = k_max (the key holder adds
#: a Gaussian to every decrypted coefficient, keyholder/flooding.py; the bound includes that noise's
#: 2^-40 tail). Chosen by measurement of bytes against W error: at 2e-2 a d = 512, C = 100 session with
#: k_max 100 fits 39 bytes per value (scale 2^60, slot sigma 1.6e-3) and d <= 256 sessions 34-35, and the
#: selection then spends any bits the primes leave over on a larger scale.
DEFAULT_MAX_ABS_ERROR = 1e-3


def count_breaks(layout: Layout) -> tuple:
    """Where the counts block (n, class counts, contributors, tag) starts: its own ciphertext chunk, so
    its values never share a decode with Gram or cross entries."""
    return (layout.slices["n"].start,)


def ckks_session_params(session_id: str, layout: Layout, gamma: float, bounds: Bounds, *,
                        max_abs_error: float = DEFAULT_MAX_ABS_ERROR,
                        max_poly_modulus_degree: int = 16384, flooding: str = "heuristic") -> SessionParams:
    """Session parameters with CKKS parameters chosen from ``bounds`` and the
    precision target ``max_abs_error``; not yet bound to a key.

    ``flooding``: how the key holder's flooding bounds the key error it must hide
    (:func:`secure_afl.hazmat.ckks.key_error_bound`): "heuristic" (default, the independence
    heuristic) or "proved" (the honest-encryption worst case K (N/2 + 1), without the independence
    heuristic but still assuming honest encryption and the float64 sampler; larger noise, so a
    larger scale for the same target). Only "proved" enters ``backend_params`` (so the signed parameters,
    and their digest, of a default session are what they were).

    The smallest modulus chain that holds ``bounds.aggregate_bound(gamma)``
    for ``bounds.k_max`` clients with the FLOODED release's per-entry bound <= ``max_abs_error``
    at 128-bit security (:func:`secure_afl.hazmat.ckks.select_parameters`). Raises
    :class:`InvalidParameterError` with the reason and the fix when none does.
    """
    unbound = SessionParams(session_id, "ckks", layout, gamma, bounds)
    chosen = hz.select_parameters(bounds.aggregate_bound(gamma), bounds.k_max, max_abs_error=max_abs_error,
                                  max_poly_modulus_degree=max_poly_modulus_degree, length=layout.length,
                                  breaks=count_breaks(layout), key_error=flooding)
    extra = {} if flooding == "heuristic" else {"flooding": flooding}
    return unbound.with_backend_params(**chosen.to_dict(), max_abs_error=float(max_abs_error), **extra)


#: Common name for :func:`ckks_session_params` (see :func:`secure_afl.backends.he_module`).
session_params = ckks_session_params

def ckks_parameters(params: SessionParams) -> hz.CKKSParameters:
    """The :class:`~secure_afl.hazmat.ckks.CKKSParameters` of a ckks session."""
    if params.backend != "ckks":
        raise InvalidParameterError(f"session backend is {params.backend!r}, not 'ckks'")
    return hz.CKKSParameters.from_dict(params.backend_params)


def generate_keys(params: SessionParams) -> CKKSKeyPair:
    """Key holder: a FRESH asymmetric context for this session's CKKS parameters.

    The public context holds the public key only: no secret key, and no
    relinearisation or Galois keys (sums need neither; the context is smaller).
    """
    ctx = hz.generate_context(ckks_parameters(params))
    return CKKSKeyPair(secret_context=hz.serialize_secret(ctx), public_context=hz.serialize_public(ctx))


def bind_public_context(params: SessionParams, public_context: bytes) -> SessionParams:
    """Bind ``sha256(public_context)`` into ``params`` (so into every payload's digest)."""
    hz.load_context(public_context, ckks_parameters(params), secret=False)
    return params.with_backend_params(**{PUBLIC_CONTEXT_KEY: hz.context_sha256(public_context)})


def new_ckks_session(session_id: str, layout: Layout, gamma: float, bounds: Bounds, **kw):
    """Key holder convenience: ``(params bound to a fresh key, CKKSKeyPair)``."""
    params = ckks_session_params(session_id, layout, gamma, bounds, **kw)
    keys = generate_keys(params)
    return bind_public_context(params, keys.public_context), keys


def expected_abs_error(params: SessionParams, n_clients: int | None = None, *,
                       magnitude: float | None = None, cp: hz.CKKSParameters | None = None) -> float:
    """Per-entry error bound (E) of a revealed K-sum (hazmat docstring).

    ``n_clients`` defaults to ``bounds.k_max``; ``magnitude`` (sum over clients
    of max |entry|) defaults to the declared worst case ``n_clients *
    hospital_bound(gamma)``.
    """
    p = ckks_parameters(params) if cp is None else cp
    k = params.bounds.k_max if n_clients is None else int(n_clients)
    m = k * params.bounds.hospital_bound(params.gamma) if magnitude is None else float(magnitude)
    return hz.expected_abs_error(p, k, m)


# -- secret context at rest (key holder) -----------------------------------------------
def _ad(session_id: str) -> bytes:
    return _AD_PREFIX + session_id.encode()


def save_secret_context(path, secret_context: bytes, *, session_id: str, passphrase=None,
                        key: bytes | None = None, overwrite: bool = False, scrypt_log2_n: int = 17) -> None:
    """Write the secret context sealed with AES-256-GCM, file mode 0600.

    The AEAD key is ``key`` (32 random bytes from a key file) or
    scrypt(passphrase, n=2^scrypt_log2_n, r=8, p=1); ``session_id`` is
    authenticated as associated data, so a file cannot be replayed as another
    session's key.
    """
    blob = seal_secret(secret_context, associated_data=_ad(session_id), passphrase=passphrase, key=key,
                          scrypt_log2_n=scrypt_log2_n)
    write_file(path, blob, exclusive=not overwrite)  # 0600 also when overwriting a wider-mode file


def load_secret_context(path, *, session_id: str, passphrase=None, key: bytes | None = None) -> bytes:
    """Read back :func:`save_secret_context`; a wrong passphrase/key/session raises :class:`InvalidKey`."""
    with open(os.fspath(path), "rb") as f:
        blob = f.read()
    return open_secret(blob, associated_data=_ad(session_id), passphrase=passphrase, key=key)


# -- the backend ----------------------------------------------------------------------
class _CKKSCombiner(Combiner):
    """Server: running sum of ciphertext chunks. Memory: one contribution's worth."""

    def __init__(self, backend: "CKKSBackend", ctx):
        super().__init__()
        self._b = backend
        self._ctx = ctx
        self._sum = None

    def _add(self, payload: bytes) -> None:
        # parse and check everything before touching the running sum (all-or-nothing)
        chunks = self._b._load(self._ctx, payload, "contribution")
        self._sum = self._b._hz.add_chunks(self._sum, chunks)

    def _partial(self) -> bytes:
        return self._b._hz.dump_chunks(self._sum, self._b._n_items())

    def _merge(self, body: bytes) -> None:
        self._sum = self._b._hz.add_chunks(self._sum, self._b.load_partial(self._ctx, body))

    def _aggregate(self) -> bytes:
        body = self._b._hz.dump_chunks(self._sum, self._b._n_items())
        self._sum = None
        return seal(self._b.params, "aggregate", body, contributors=self.count)


class CKKSBackend(ProtectionBackend):
    """CKKS protection. ``params`` must come from :func:`ckks_session_params` and,
    for protect/combine/reveal, be bound to a key (:func:`bind_public_context`).

    Raises
    ------
    InvalidParameterError
        When the CKKS parameters in ``params`` do not hold the declared bounds.
    """

    name = "ckks"
    _hz = hz  # the scheme's primitives; the bfv backend swaps in its own

    @property
    def scheme(self):
        """The scheme's hazmat module (context loading, chunk addition) for the key holder's re-sum."""
        return self._hz

    def __init__(self, params: SessionParams):
        super().__init__(params)
        self._contexts: dict = {}
        self.ckks_ = self._scheme_parameters(params)  # derived once; the key holder's path reads it from here
        self._check_holds_bounds()

    def _scheme_parameters(self, params: SessionParams):
        return ckks_parameters(params)

    def _n_items(self) -> int:
        """Encrypted values per contribution."""
        return self.params.layout.length

    @property
    def breaks(self) -> tuple:
        return count_breaks(self.params.layout)

    @property
    def spans(self) -> list:
        """The values each ciphertext chunk of an upload holds."""
        return self.ckks_.spans(self.params.layout.length, self.breaks)

    def _chunk_kw(self) -> dict:
        return {"breaks": self.breaks} if self._hz is hz else {}

    def flooding(self, n_clients: int) -> dict:
        """How the key holder floods a K-sum (``keyholder/flooding.py``): the coefficients flooded (every
        coefficient of every chunk), their sigma, the decoded slots' sigma and the coefficient bound."""
        cp, coeffs = self.ckks_, self.ckks_.poly_modulus_degree * len(self.spans)
        sigma = hz.flood_coefficient_sigma(cp, n_clients, coeffs, model=self.key_error_model)
        return {"coefficients": coeffs, "sigma": sigma, "slot_sigma": hz.slot_sigma(cp, sigma),
                "coefficient_bound": hz.flood_coefficient_bound(cp, sigma, coeffs), "model": self.key_error_model}

    @property
    def key_error_model(self) -> str:
        """The signed key-error model the flooding is sized with (:func:`ckks_session_params`)."""
        return self.params.backend_params.get("flooding", "heuristic")

    def _check_holds_bounds(self) -> None:
        params = self.params
        need, k = params.bounds.aggregate_bound(params.gamma), params.bounds.k_max
        g = self.flooding(k)["coefficient_bound"]
        if need > self.ckks_.max_aggregate(k, g):
            raise InvalidParameterError(
                f"CKKS parameters {self.ckks_.to_dict()} hold aggregates up to {self.ckks_.max_aggregate(k, g):.4g} "
                f"beside the key holder's flooding, but the declared bounds need {need:.4g}; create the session "
                "with ckks_session_params, or lower n_max, max_norm or k_max."
            )
        target = params.backend_params.get("max_abs_error")
        if target is not None:
            tol = hz.flooded_tolerance(self.ckks_, k, self.flooding(k)["coefficients"], params.layout.length,
                                       0.0, model=self.key_error_model)[2]
            if tol > float(target):
                raise InvalidParameterError(
                    f"CKKS parameters {self.ckks_.to_dict()} leave a flooded error up to {tol:.3g} per entry at "
                    f"k_max={k}, above the session's precision target {target}; create the session with "
                    "ckks_session_params"
                )

    # -- key binding ---------------------------------------------------------------
    def _bound_digest(self) -> str:
        digest = self.params.backend_params.get(PUBLIC_CONTEXT_KEY)
        if not isinstance(digest, str):
            raise InvalidParameterError(
                "session parameters are not bound to a public context; the key holder must call "
                "bind_public_context(params, public_context) and publish the result"
            )
        return digest

    def _public_context(self, public_context: bytes):
        digest = self._bound_digest()
        if not isinstance(public_context, (bytes, bytearray, memoryview)):
            raise TypeError("public_context must be bytes")
        public_context = bytes(public_context)
        sha = self._hz.context_sha256(public_context)
        if sha in self._contexts:
            return self._contexts[sha]
        ctx = self._hz.load_context(public_context, self.ckks_, secret=False)  # SecretKeyNotAllowed first
        if sha != digest:
            raise ParameterMismatch("public context is not the one bound into this session's parameters")
        self._contexts = {sha: ctx}
        return ctx

    def _secret_context(self, secret_context: bytes):
        digest = self._bound_digest()
        ctx = self._hz.load_context(secret_context, self.ckks_, secret=True)
        if self._hz.context_sha256(self._hz.serialize_public(ctx)) != digest:
            raise ParameterMismatch("secret context belongs to another key than this session's")
        return ctx

    def _load(self, ctx, payload: bytes, kind: str) -> list:
        env = open_envelope(self.params, payload, kind)
        return self._hz.load_chunks(ctx, self.ckks_, env.body, self._n_items(), **self._chunk_kw())

    # -- the three roles ---------------------------------------------------------------
    def admit(self, payload: bytes, tag, *, hospital: str, identity_pub, payload_sha256: str):
        """The signed aggregate tag of this payload (what the key holder checks the sum against), then the
        envelope."""
        from ..tagging import verify_tag

        if not isinstance(tag, dict):
            raise MalformedPayload(f"a {self.name} upload needs its signed aggregate tag")
        verify_tag(tag, identity_pub, self.params, hospital, payload_sha256)
        open_envelope(self.params, payload, "contribution")
        return None

    def protect(self, vector, *, public_context: bytes, **kw) -> bytes:
        """Hospital: check bounds, encrypt chunk by chunk, seal a "contribution".

        Raises :class:`BoundsExceeded` before any encryption when an entry
        exceeds ``bounds.hospital_bound(gamma)``.
        """
        v = check_vector(self.params, vector)
        ctx = self._public_context(public_context)
        return seal(self.params, "contribution", self._hz.encrypt_vector(ctx, self.ckks_, v, self.breaks))

    def combiner(self, *, public_context: bytes, **kw) -> Combiner:
        """Server: a streaming combiner. Refuses a context with a secret key (:class:`SecretKeyNotAllowed`)."""
        return _CKKSCombiner(self, self._public_context(public_context))

    def reveal(self, aggregate: bytes, *, secret_context: bytes, **kw) -> np.ndarray:
        """Decrypt a sealed aggregate to a float64 vector of length L (tests and tools).

        The key holder never calls this on bytes the server computed: it
        re-sums the signed contributions itself (:meth:`load_contribution`,
        :meth:`decrypt_sum`). A public context raises :class:`InvalidKey`.
        """
        env = open_envelope(self.params, aggregate, "aggregate")
        ctx = self.keyholder_context(secret_context)
        return self.decrypt_sum(ctx, self._hz.load_chunks(ctx, self.ckks_, env.body, self.params.layout.length,
                                                          **self._chunk_kw()))

    def keyholder_context(self, secret_context: bytes):
        """The key holder's context, checked to be the key this session's parameters bind."""
        return self._secret_context(secret_context)

    def load_contribution(self, ctx, payload: bytes) -> list:
        """One hospital's payload as checked ciphertext chunks under ``ctx`` (envelope binding,
        framing, level, scale, size): :class:`ParameterMismatch`, :class:`MalformedPayload` or
        :class:`InvalidContribution` otherwise."""
        return self._load(ctx, payload, "contribution")

    def load_partial(self, ctx, body: bytes) -> list:
        """A combiner's :meth:`~secure_afl.backends.Combiner.partial` as checked chunks under ``ctx``
        (a sum keeps the level, scale and size of a fresh ciphertext, so the same checks hold)."""
        return self._hz.load_chunks(ctx, self.ckks_, body, self._n_items(), **self._chunk_kw())

    def decrypt_sum(self, ctx, chunks: list) -> np.ndarray:
        """Decrypt summed chunks and check the range (:meth:`check_range` at this session's
        decryption bound): for tests and tools. The key holder decrypts once with
        :meth:`decrypt_flooded` and only then checks the range of the flooded values."""
        v = self.decrypt_raw(ctx, chunks)
        self.check_range(v, expected_abs_error(self.params, cp=self.ckks_))
        return v

    def decrypt_flooded(self, ctx, chunks: list, sigma: float) -> np.ndarray:
        """The ONE decryption the key holder makes: every coefficient of every summed chunk gets a fresh
        rounded Gaussian of standard deviation ``sigma`` before it is decrypted, then it is decoded
        (:func:`secure_afl.hazmat.ckks.flood_decrypt`). Nothing unflooded exists afterwards."""
        return hz.flood_decrypt(ctx, self.ckks_, chunks, sigma, self.params.layout.length)

    def decrypt_raw(self, ctx, chunks: list) -> np.ndarray:
        """The decryption of summed chunks, unchecked: every entry within :func:`expected_abs_error`
        of the true sum. It carries the decryption error, so it must be flooded before anything
        (even a check's outcome) depends on it."""
        return self._hz.decrypt_chunks(ctx, chunks, self.params.layout.length)

    def check_range(self, v: np.ndarray, tol: float) -> None:
        """:class:`SanityCheckFailed` when an entry of ``v`` (known to within ``tol`` of the true sum)
        lies beyond the declared aggregate bound; the message carries no value."""
        limit = self.params.bounds.aggregate_bound(self.params.gamma) + float(tol)
        if not np.all(np.isfinite(v)) or float(np.max(np.abs(v))) > limit:
            raise SanityCheckFailed(
                "decrypted aggregate leaves the declared aggregate bound: the homomorphic sum wrapped "
                "(a contribution exceeded the bounds) or was not formed from this session's contributions",
                reason="aggregate_out_of_range")
