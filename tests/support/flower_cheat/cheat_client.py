"""The real ClientApp, except that hospital h3 uploads a split
contribution whose class 1 count is -1 (a signed, well-formed upload with a proof of a false statement)."""

import secure_afl.flower.client_app as real
from secure_afl.backends import get_backend
from secure_afl.clients.hospital import protect_vector
from secure_afl.hazmat import flp

_honest = real.protect_contribution


def _protect(party, params, stats, *, public_context=None):
    if params.backend != "split" or party.name != "h3":
        return _honest(party, params, stats, public_context=public_context)
    be = get_backend(params)
    lanes = be.circuit.lanes(protect_vector(params, stats)).copy()
    lanes[params.layout.slices["counts"].start + 1] = (-(1 << be.circuit.f1)) % flp.P
    body, seed, com = be.circuit.prove(party.name, lanes=lanes, check=False)
    return be.seal_upload(body, seed, com, public_context, party.name, party.identity_key())


real.protect_contribution = _protect
app = real.app
