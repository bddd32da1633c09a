"""The key holder's flooded ckks release of real encryptions, shared by the flooding tests."""

from __future__ import annotations

from secure_afl.backends.ckks import CKKSBackend
from secure_afl.hazmat import ckks as hz
from secure_afl.keyholder.flooding import flood_decryption, flood_plan


def flooded_release(params, keys, vecs):
    """The key holder's flooded release of real encryptions of ``vecs``: (FloodedRelease, plan, backend)."""
    be = CKKSBackend(params)
    ctx = be.keyholder_context(keys.secret_context)
    acc = None
    for v in vecs:
        acc = hz.add_chunks(acc, be.load_contribution(ctx, be.protect(v, public_context=keys.public_context)))
    plan = flood_plan(be, len(vecs))
    return flood_decryption(plan, be, ctx, acc), plan, be
