"""The session definition: one strict schema, one loader, and the operator's signature every party pins.

What a session *is* (backend, the fixed roster of hospitals, bounds, layout,
gamma, min_clients, the secagg threshold / graph degree / round limit, the DP
spec, the feature extractor, deadlines) changes what the protocol protects,
so no party may learn it from the server. The consortium operator writes it
in ``session.toml``, and ``secure-afl session sign`` turns it into a signed
definition::

    {"definition": {...canonical, every default filled in...},
     "signature": "<hex ECDSA P-256 / SHA-256 by the consortium CA key>"}

over ``b"secure-afl/session/v1\\0" + canonical JSON of the definition``. It
lands in ``<pki>/sessions/<id>.json`` of the operator's PKI directory and of
every party's bundle. The CA key is the operator's key: it already signs the
roster, and a party pins nothing else (``ca.pem`` comes with its bundle). The
server, the hospitals, the key holder and the Flower apps all call
:func:`load_signed` and build the session parameters with
:meth:`SessionDefinition.session_params`, so there is one derivation; a
value the server relays that disagrees is refused with the field named
(:func:`check_same`).

The definition is canonical JSON rather than TOML because a signature needs
one byte string per value; ``session.toml`` stays the file people edit, and
:func:`write_toml` writes one that escapes every string (TOML basic strings).

Strictness: an unknown or misspelled section or key is refused with its name
and the closest known one (``min_client`` -> ``min_clients``); a wrong type
(``dim = "512"``, ``gamma = true``) is refused; impossible combinations
(``min_clients`` above the roster, a secagg threshold above the share
holders, a quorum nobody can reach) are refused when the operator signs.
``[server]`` (host, port, directories, timeouts of the HTTP layer) is
deployment, not protocol: it is checked here but not signed.

Modules: :mod:`.schema` (the keys, the strict parser, the reference), :mod:`.definition` (the canonical
definition and what it survives), :mod:`.signed` (signing and loading), :mod:`.relay` (checking what the
server relays), :mod:`.toml_writer` (``session.toml`` for people).
"""
