"""The server's running sum in worker processes (``[server] combine_workers``), through the real service:
a ``secure-afl server run`` process on 127.0.0.1, hospitals uploading ckks ciphertexts over HTTPS at once,
the key holder's real finalize. What is measured: the summing processes the server really started, the
released aggregate against the serial sum of the stored uploads (bit for bit: ciphertext addition is exact),
refusals, and what a killed summing process costs (nothing accepted is lost)."""

from __future__ import annotations

import hashlib
import os
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from secure_afl.backends import get_backend
from secure_afl_tools.bench_service import ServerMeter
from secure_afl.backends.ckks import ckks_session_params
from secure_afl.envelope import peek_header, seal
from secure_afl.exceptions import SecureAFLError
from secure_afl.packing import Layout
from secure_afl.params import Bounds, SessionParams
from secure_afl.server.store import Store
from secure_afl.tagging import new_tag, seal_tag, sign_tag

pytestmark = [pytest.mark.e2e]

HOSPITALS = tuple(f"h{i}" for i in range(1, 7))


def _summing_workers(server_pid: int) -> list[int]:
    """Child processes of the server that run a multiprocessing worker (spawned interpreters)."""
    found = []
    for pid in ServerMeter(server_pid).children():
        try:
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def _open(c):
    c.start()
    params = ckks_session_params(c.session_id, Layout(c.dim, c.classes), 1.0, Bounds(c.max_norm, 1000, 8))
    c.keyholder.keygen(params)
    with c.connect_keyholder() as conn:
        c.keyholder.publish(conn)


def _submit(c, name):
    cl = c.hospital(name)
    cl.conn.busy_s = 60.0  # bounded: a server that stays 'busy' fails the test within a minute
    try:
        return cl.submit(c.stats(*c.data(name)))
    finally:
        cl.close()


def _serial_sum_of_stored(c) -> tuple[bytes, bytes, int]:
    """(released aggregate, serial fold of the stored uploads, uploads stored), read from the server's files."""
    store = Store(c.root / "server" / c.session_id)
    try:
        params = SessionParams.from_dict(store.get_meta("params"))
        ctx = store.get_blob(store.get_meta("public_context_sha256"))
        comb = get_backend(params).combiner(public_context=ctx)
        rows = store.uploads()
        for row in rows:
            comb.add(store.get_blob(row["payload_sha256"]))
        return store.get_blob(store.get_meta("aggregate_sha256")), comb.aggregate(), len(rows)
    finally:
        store.close()


def test_concurrent_uploads_summed_by_two_processes_release_the_serial_sum(consortium):
    # Prepare
    c = consortium(backend="ckks", hospitals=HOSPITALS, min_clients=2, extra_server={"combine_workers": 2})
    _open(c)
    honest = HOSPITALS[:5]

    # Execute: five hospitals at once, then one whose own software cuts a ciphertext short before sealing and
    # signing it (only the summing worker that parses the ciphertexts can tell)
    with ThreadPoolExecutor(len(honest)) as pool:
        receipts = list(pool.map(lambda h: _submit(c, h), honest))
    workers_during = _summing_workers(c.server.proc.pid)
    bad = c.hospital("h6")
    params = bad.fetch_params()
    ctx = bad.conn.request("GET", bad.conn.path("/context"), signed=False).content
    tag = new_tag(params)
    good = get_backend(params).protect(bad.protect_vector(params, c.stats(*c.data("h6")), tag=tag),
                                       public_context=ctx)
    env = peek_header(good)
    body = env.body[:-100]  # the last ciphertext cut short; the envelope is sealed over the bad bytes
    extra = {k: v for k, v in env.header.items() if k not in ("session_id", "backend", "params_digest", "layout",
                                                             "kind", "body_sha256", "body_len")}
    payload = seal(params, "contribution", body, **extra)
    with pytest.raises(SecureAFLError) as refused:
        bad.upload(params, payload, tag=sign_tag(bad.party.identity_key(), params, "h6",
                                                 hashlib.sha256(payload).hexdigest(), seal_tag(params, "h6", tag)))
    bad.close()
    with c.connect_keyholder() as conn:
        res = c.keyholder.finalize(conn, min_clients=2)
    workers_after = _summing_workers(c.server.proc.pid)

    # Assert: the server summed in two processes, refused the corrupt ciphertext with a reason, released the
    # exact serial sum of the five stored uploads, and stopped its summing processes at the release
    assert len(receipts) == 5 and len(workers_during) == 2 and workers_after == []
    assert 400 <= refused.value.http_status < 500 and refused.value.reason != "error"
    released, serial, stored = _serial_sum_of_stored(c)
    assert stored == 5 and released == serial
    assert sorted(res.report["participants"]) == list(honest)
    refusals = [line for line in c.audit_path().read_text().splitlines() if '"outcome":"refused"' in line]
    assert any('"actor":"h6"' in line and '"event":"upload"' in line for line in refusals)


@pytest.mark.security
def test_a_killed_summing_process_loses_no_accepted_upload(consortium):
    # Prepare: two uploads accepted, both summing processes started
    c = consortium(backend="ckks", hospitals=HOSPITALS[:4], min_clients=2, extra_server={"combine_workers": 2})
    _open(c)
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda h: _submit(c, h), HOSPITALS[:2]))
    workers = _summing_workers(c.server.proc.pid)
    assert len(workers) == 2

    # Execute: one summing process dies (the OOM killer, an operator); two more hospitals upload
    os.kill(workers[0], signal.SIGKILL)
    for h in HOSPITALS[2:4]:
        _submit(c, h)  # answered 'busy' while the server sums its stored uploads again; the client sends again
    with c.connect_keyholder() as conn:
        res = c.keyholder.finalize(conn, min_clients=2)

    # Assert: all four in the release exactly once, the aggregate is the serial sum of the stored four
    released, serial, stored = _serial_sum_of_stored(c)
    assert stored == 4 and released == serial
    assert sorted(res.report["participants"]) == list(HOSPITALS[:4])


def test_split_uploads_summed_by_two_processes_release_what_one_process_releases(consortium):
    # Prepare: the same three hospitals' split uploads, once summed in the server's process (the running sum
    # takes the words its upload check opened) and once by two summing processes (which take the bytes)
    from secure_afl import split

    released = {}
    for workers in (1, 2):
        c = consortium(backend="split", hospitals=HOSPITALS[:3], min_clients=2,
                       extra_server={"combine_workers": workers}).start()
        with c.connect_keyholder() as conn:
            c.keyholder.keygen(split.split_session_params(c.session_id, Layout(c.dim, c.classes), 1.0,
                                                          Bounds(c.max_norm, 1000, 8)))
            c.keyholder.publish(conn)
        # Execute
        receipts = [_submit(c, h) for h in HOSPITALS[:3]]
        with c.connect_keyholder() as conn:
            res = c.keyholder.finalize(conn, min_clients=2)
        released[workers] = (len(receipts), res)

    # Assert: every upload accepted either way, and the same sums and model, bit for bit
    (n1, one), (n2, two) = released[1], released[2]
    assert n1 == n2 == 3 and one.report["participants"] == two.report["participants"] == list(HOSPITALS[:3])
    lay = Layout(one.params.layout.dim, one.params.layout.n_classes)
    assert np.array_equal(lay.pack(one.stats), lay.pack(two.stats)) and np.array_equal(one.W, two.W)
