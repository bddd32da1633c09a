"""Load: K plain hospitals upload at once to one real server process on 127.0.0.1.

Bounded in count (K hospitals, one upload each; every tenth then sends the same upload
again, which returns the same receipt, and a different one, which is refused) and in
time (every thread is joined with a deadline). The server keeps its DEFAULT limits (64
connections, 4 request bodies read at once): the crowd is answered 503 and 429 ``busy``,
and the clients wait and send again (clients/transport.py). Every accepted upload must be
counted exactly once: receipts == manifest participants == accepted audit records, every
hospital is accepted, and no answer is a 5xx. K = 200 runs by default; K = 1000 is
marked slow (``make test-slow``): it takes minutes on a 2-core machine.
"""

import json
import threading

import numpy as np
import pytest

from secure_afl.exceptions import SecureAFLError

from support import Consortium, verify_countersigned

pytestmark = pytest.mark.e2e


def _crowd(tmp_path, K, *, extra_server=None, join_s=600):
 (tests/test_upload_retry.py drives the retry path itself)names = [f"h{i:04d}" for i in range(K)]
 (tests/test_upload_retry.py drives the retry path itself)c = Consortium(tmp_path, backend="plain", hospitals=names, min_clients=2, k_max=K,
 (tests/test_upload_retry.py drives the retry path itself)               extra_server=extra_server).start()
 (tests/test_upload_retry.py drives the retry path itself)try:
 (tests/test_upload_retry.py drives the retry path itself)    clients = {h: c.hospital(h) for h in names}
 (tests/test_upload_retry.py drives the retry path itself)    stats = {h: c.stats(*c.data(h, n=8, seed=i)) for i, h in enumerate(names)}
 (tests/test_upload_retry.py drives the retry path itself)    start = threading.Barrier(K)
 (tests/test_upload_retry.py drives the retry path itself)    receipts, refused, second, other = {}, {}, {}, {}

 (tests/test_upload_retry.py drives the retry path itself)    def one(h):
 (tests/test_upload_retry.py drives the retry path itself)        cl = clients[h]
 (tests/test_upload_retry.py drives the retry path itself)        try:
 (tests/test_upload_retry.py drives the retry path itself)            try:
 (tests/test_upload_retry.py drives the retry path itself)                params = cl.fetch_params()
 (tests/test_upload_retry.py drives the retry path itself)                payload, tag = cl.protect(params, stats[h])
 (tests/test_upload_retry.py drives the retry path itself)            except BaseException:
 (tests/test_upload_retry.py drives the retry path itself)                start.abort()  # the crowd cannot form: release the others now, not at the timeout
 (tests/test_upload_retry.py drives the retry path itself)                raise
 (tests/test_upload_retry.py drives the retry path itself)            start.wait(timeout=join_s)  # all uploads in flight together
 (tests/test_upload_retry.py drives the retry path itself)            receipts[h] = cl.upload(params, payload, tag=tag)
 (tests/test_upload_retry.py drives the retry path itself)            if int(h[1:]) % 10 == 0:
 (tests/test_upload_retry.py drives the retry path itself)                # the same payload again gets the same receipt back (idempotent), not a second count
 (tests/test_upload_retry.py drives the retry path itself)                again = cl.upload(params, payload, tag=tag, attempts=1)
 (tests/test_upload_retry.py drives the retry path itself)                if again["payload_sha256"] != receipts[h]["payload_sha256"]:
 (tests/test_upload_retry.py drives the retry path itself)                    other[h] = "a second receipt for the same payload"
 (tests/test_upload_retry.py drives the retry path itself)                # a different payload from the same hospital is refused
 (tests/test_upload_retry.py drives the retry path itself)                other_payload, other_tag = cl.protect(params, stats[names[(int(h[1:]) + 1) % K]])
 (tests/test_upload_retry.py drives the retry path itself)                try:
 (tests/test_upload_retry.py drives the retry path itself)                    cl.upload(params, other_payload, tag=other_tag, attempts=1)
 (tests/test_upload_retry.py drives the retry path itself)                    other[h] = "second contribution accepted"
 (tests/test_upload_retry.py drives the retry path itself)                except SecureAFLError as e:
 (tests/test_upload_retry.py drives the retry path itself)                    second[h] = e
 (tests/test_upload_retry.py drives the retry path itself)        except SecureAFLError as e:
 (tests/test_upload_retry.py drives the retry path itself)            refused[h] = e
 (tests/test_upload_retry.py drives the retry path itself)        except Exception as e:  # noqa: BLE001 - reported by the assertions
 (tests/test_upload_retry.py drives the retry path itself)            other[h] = f"{type(e).__name__}: {e}"

 (tests/test_upload_retry.py drives the retry path itself)    threads = [threading.Thread(target=one, args=(h,), daemon=True) for h in names]
 (tests/test_upload_retry.py drives the retry path itself)    for th in threads:
 (tests/test_upload_retry.py drives the retry path itself)        th.start()
 (tests/test_upload_retry.py drives the retry path itself)    for th in threads:
 (tests/test_upload_retry.py drives the retry path itself)        th.join(timeout=join_s)
 (tests/test_upload_retry.py drives the retry path itself)    assert not any(th.is_alive() for th in threads), "uploads did not finish within the bound"
 (tests/test_upload_retry.py drives the retry path itself)    retries = sum(cl.conn.busy_retries for cl in clients.values())
 (tests/test_upload_retry.py drives the retry path itself)    for cl in clients.values():
 (tests/test_upload_retry.py drives the retry path itself)        cl.close()

 (tests/test_upload_retry.py drives the retry path itself)    assert other == {}
 (tests/test_upload_retry.py drives the retry path itself)    assert refused == {}, {h: (getattr(e, "status_code", None), e.reason) for h, e in refused.items()}
 (tests/test_upload_retry.py drives the retry path itself)    assert len(second) == len(names[::10]) and {e.reason for e in second.values()} == {"duplicate"}
 (tests/test_upload_retry.py drives the retry path itself)    assert all(getattr(e, "status_code", 500) < 500 for e in second.values())

 (tests/test_upload_retry.py drives the retry path itself)    conn = c.connect_keyholder()
 (tests/test_upload_retry.py drives the retry path itself)    accepted = sorted(receipts)
 (tests/test_upload_retry.py drives the retry path itself)    assert accepted == names
 (tests/test_upload_retry.py drives the retry path itself)    res = c.keyholder.finalize(conn, min_clients=2)
 (tests/test_upload_retry.py drives the retry path itself)    manifest = conn.request("GET", conn.path("/manifest")).json()
 (tests/test_upload_retry.py drives the retry path itself)    conn.close()
 (tests/test_upload_retry.py drives the retry path itself)    assert sorted(p["hospital"] for p in manifest["participants"]) == accepted
 (tests/test_upload_retry.py drives the retry path itself)    assert res.report["participants"] == accepted
 (tests/test_upload_retry.py drives the retry path itself)    v = verify_countersigned(c)
 (tests/test_upload_retry.py drives the retry path itself)    assert v.n_receipts == len(accepted)
 (tests/test_upload_retry.py drives the retry path itself)    records = [json.loads(line) for line in c.audit_path().read_text().splitlines() if line.strip()]
 (tests/test_upload_retry.py drives the retry path itself)    uploads = [r["actor"] for r in records if r["event"] == "upload" and r["outcome"] == "accepted"]
 (tests/test_upload_retry.py drives the retry path itself)    assert sorted(a.split(":")[-1] for a in uploads) == accepted  # one accepted upload record per hospital
 (tests/test_upload_retry.py drives the retry path itself)    total = sum((stats[h] for h in accepted[1:]), stats[accepted[0]])
 (tests/test_upload_retry.py drives the retry path itself)    assert np.isclose(res.report["contributors"], len(accepted))
 (tests/test_upload_retry.py drives the retry path itself)    assert np.isclose(res.stats.n, total.n)
 (tests/test_upload_retry.py drives the retry path itself)    return retries
 (tests/test_upload_retry.py drives the retry path itself)finally:
 (tests/test_upload_retry.py drives the retry path itself)    c.stop()


def test_200_concurrent_plain_uploads_default_limits_each_counted_once(tmp_path):
 (tests/test_upload_retry.py drives the retry path itself)_crowd(tmp_path, 200)


@pytest.mark.slow
def test_1000_concurrent_plain_uploads_default_limits_each_counted_once(tmp_path):
    # whether the crowd meets a 429 depends on how fast this machine reads bodies (a body slot is waited for
    # up to read_timeout_s before "busy"), so the busy-retry count is a measurement here, not a claim
    # (test_upload_retry.py drives the client's send-again path, test_parallel.py the 429 "busy")
    _crowd(tmp_path, 1000, join_s=900)


def test_retry_delay_honours_retry_after_and_spreads_the_crowd():
 (tests/test_upload_retry.py drives the retry path itself)import random

 (tests/test_upload_retry.py drives the retry path itself)from secure_afl.clients.transport import BACKOFF_MAX_S, retry_delay

 (tests/test_upload_retry.py drives the retry path itself)rng = random.Random(7)
 (tests/test_upload_retry.py drives the retry path itself)after = [retry_delay(0, "3", rng=rng) for _ in range(200)]
 (tests/test_upload_retry.py drives the retry path itself)assert min(after) >= 3.0 and max(after) <= 3.75 and len(set(after)) > 150
 (tests/test_upload_retry.py drives the retry path itself)for attempt in range(12):
 (tests/test_upload_retry.py drives the retry path itself)    d = [retry_delay(attempt, None, rng=rng) for _ in range(200)]
 (tests/test_upload_retry.py drives the retry path itself)    assert 0.0 <= min(d) and max(d) <= min(BACKOFF_MAX_S, 0.25 * 2 ** attempt)
 (tests/test_upload_retry.py drives the retry path itself)assert retry_delay(3, "soon", rng=rng) <= 2.0  # an unreadable Retry-After falls back to the backoff


@pytest.mark.parametrize("backend", ["plain", "secagg"])
def test_bench_service_small_session_reports_every_phase(tmp_path, backend):
 (tests/test_upload_retry.py drives the retry path itself)from secure_afl.bench_service import format_report, run_service_bench

 (tests/test_upload_retry.py drives the retry path itself)r = run_service_bench(backend, 4, dim=6, classes=3, samples=8, workdir=str(tmp_path))
 (tests/test_upload_retry.py drives the retry path itself)assert list(r["phases"]) == ["pki", "server", "hospitals", "release"]
 (tests/test_upload_retry.py drives the retry path itself)assert r["contributors"] == 4 and r["w_rel_error_vs_plain"] <= 1e-12
 (tests/test_upload_retry.py drives the retry path itself)served = [p for n, p in r["phases"].items() if n != "pki"]
 (tests/test_upload_retry.py drives the retry path itself)assert all(p["server_cpu_s"] >= 0 and p["server_peak_rss"] > 0 for p in served)
 (tests/test_upload_retry.py drives the retry path itself)assert sum(p["server_cpu_s"] for p in served) > 0  # measured from the server process, not a placeholder
 (tests/test_upload_retry.py drives the retry path itself)assert r["bytes_up_per_hospital"] > 0 and r["bytes_down_per_hospital"] > 0 and r["server_disk_bytes"] > 0
 (tests/test_upload_retry.py drives the retry path itself)assert "||W - W_plain||" in format_report(r)
 (tests/test_upload_retry.py drives the retry path itself)assert 0 < r["hospital_cpu_s"]["mean"] <= r["hospital_cpu_s"]["max"]
 (tests/test_upload_retry.py drives the retry path itself)if backend == "secagg":  # the stage timings come from the server's audit log of this round
 (tests/test_upload_retry.py drives the retry path itself)    stages = r["phases"]["hospitals"]["stages"]
 (tests/test_upload_retry.py drives the retry path itself)    assert [s["stage"] for s in stages] == ["setup", "advertise_keys", "share_keys", "masked_input", "unmask"]
 (tests/test_upload_retry.py drives the retry path itself)    assert all(s["answered"] == s["expected"] == 4 and s["outcome"] == "accepted" and s["seconds"] >= 0
 (tests/test_upload_retry.py drives the retry path itself)               for s in stages)


def test_bench_service_ckks_times_the_keyholder_resum_over_https_both_ways(tmp_path):
 (tests/test_upload_retry.py drives the retry path itself)from secure_afl.bench_service import format_report, run_service_bench
 (tests/test_upload_retry.py drives the retry path itself)from secure_afl.keyholder.verify import default_fetchers

 (tests/test_upload_retry.py drives the retry path itself)r = run_service_bench("ckks", 4, dim=6, classes=3, samples=8, workdir=str(tmp_path), compare_fetchers=True)
 (tests/test_upload_retry.py drives the retry path itself)assert list(r["phases"]) == ["pki", "server", "keys", "hospitals", "release"]
 (tests/test_upload_retry.py drives the retry path itself)by = r["phases"]["release"]["resum_s_by_fetchers"]
 (tests/test_upload_retry.py drives the retry path itself)assert sorted(by) == sorted({1, default_fetchers()}) and all(s > 0 for s in by.values())
 (tests/test_upload_retry.py drives the retry path itself)assert r["contributors"] == 4 and r["w_rel_error_vs_plain"] < 0.5  # a flooded release, not exact
 (tests/test_upload_retry.py drives the retry path itself)assert "download(s) in flight" in format_report(r)
