"""Sessions the operator-facing tests drive: a split session with its key published, honest and cheating
split hospitals, and secagg hospitals that crash before a stage and come back."""

from __future__ import annotations

import threading

from secure_afl.backends import get_backend
from secure_afl.packing import Layout


def open_split_session(consortium, hospitals=("h1", "h2", "h3"), **kw):
    """A started split consortium (one refusal allowed unless ``extra_session`` says otherwise) whose key holder
    made and published the session's key; returns (consortium, the key holder's connection)."""
    extra = {"max_refusals": 1, **kw.pop("extra_session", {})}
    c = consortium(backend="split", hospitals=hospitals, min_clients=kw.pop("min_clients", 2),
                   extra_session=extra, **kw).start()
    conn = c.connect_keyholder()
    c.keyholder.keygen(signed_params(c))
    c.keyholder.publish(conn)
    return c, conn


def signed_params(c):
    """The parameters of ``c``'s signed session, as `keyholder keygen` derives them from the definition."""
    from secure_afl.session.signed import load_signed

    return load_signed(c.pki_dir, c.session_id).session_params()


def honest_upload(c, name, seed):
    cl = c.hospital(name)
    cl.submit(c.stats(*c.data(name, seed=seed)))
    cl.close()


def split_session_at_quorum(consortium):
    """:func:`open_split_session` with its quorum in: h1's and h2's honest uploads; (consortium, connection)."""
    c, conn = open_split_session(consortium)
    honest_upload(c, "h1", 1)
    honest_upload(c, "h2", 2)
    return c, conn


def cheating_upload(c, name, seed):
    """A hospital's modified software: a well-formed, signed upload with one Gram entry of 2^61 / 2^f1 (its
    high lane, or its Field128 word at 2^(61 + f2)), which the key holder's linear check refuses. Returns
    (payload, seed statement, mask seed)."""
    cl = c.hospital(name)
    params = cl.fetch_params()
    be = get_backend(params)
    ctx = cl.conn.request("GET", cl.conn.path("/context"), signed=False).content
    circuit = be.circuit
    lanes = circuit.lanes(Layout(c.dim, c.classes).pack(c.stats(*c.data(name, seed=seed)))).copy()
    lanes[1] = circuit.F.to_field([1 << (61 if circuit.lanes_per_value == 2 else 61 + circuit.frac_bits[1])])[0]
    body, s, com = be.circuit.prove(name, lanes=lanes, check=False)
    payload, statement = be.seal_upload(body, s, com, ctx, name, cl.party.identity_key())
    cl.upload(params, payload, tag=statement)
    cl.close()
    return payload, statement, s


def run_secagg_plan(c, data, plan, timeout=90):
    """Each hospital runs the steps in ``plan[h]``: a stop_before stage (a crash) or None (a full run), each in
    a new client, all hospitals in threads. Returns (results, errors) by hospital."""
    results, errors = {}, {}

    def go(h):
        try:
            for stop in plan[h]:
                cl = c.hospital(h)
                try:
                    results[h] = cl.submit(c.stats(*data[h]), stop_before=stop, timeout=timeout)
                finally:
                    cl.close()
        except Exception as e:  # collected and asserted on by the caller
            errors[h] = e

    threads = [threading.Thread(target=go, args=(h,), daemon=True) for h in plan]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout + 60)
    return results, errors


def split_verdict(sess, body, seed, com, hospital="h1"):
    """The key holder's verdict on one proven body through the release path's protocol functions: sealed by the
    backend, checked, the server's signed verifier message at the key holder's query seed, then the key holder's
    judgement on its own share. ``sess``: ``(params, backend, server signing key, split key pair)``."""
    import hashlib

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from secure_afl import split

    params, be, server_key, keys = sess
    payload, st = be.seal_upload(body, seed, com, keys.public_context, hospital, Ed25519PrivateKey.generate())
    split.check_upload(be.circuit, payload, st)
    sha = hashlib.sha256(payload).hexdigest()
    expected = split.query_seed(split.query_key(keys.secret_context), params, hospital, sha, st.get("validity"))
    msg = split.leader_message(be.circuit, hospital, payload, st, server_key, expected)
    qs, leader = split.verify_leader_message(msg, server_key.public_key(), be.circuit, hospital, sha, expected)
    return split.helper_verdict(be.circuit, hospital, seed, st, qs, leader)
