"""Load: 200 plain hospitals upload at once to one real server process on 127.0.0.1.

Bounded in count (200 hospitals, one upload each; every tenth then sends the same upload
again, which returns the same receipt, and a different one, which is refused) and in
time (every thread is joined with a deadline). The server keeps its default cap of 4
request bodies read at once; it is given room for the connections (``max_connections``),
since uvicorn answers 503 beyond it. Every accepted upload must be counted exactly once:
receipts == manifest participants == accepted audit records, and no answer is a 5xx.
"""

import json
import threading

import numpy as np
import pytest

from secure_afl.exceptions import SecureAFLError

from service_helpers import Consortium
from test_service_e2e import _verify_countersigned

pytestmark = pytest.mark.e2e

K = 200


def test_200_concurrent_plain_uploads_each_counted_once(tmp_path):
    names = [f"h{i:03d}" for i in range(K)]
    c = Consortium(tmp_path, backend="plain", hospitals=names, min_clients=2, k_max=K,
                   extra_server={"max_connections": 2 * K + 64}).start()
    try:
        clients = {h: c.hospital(h) for h in names}
        stats = {h: c.stats(*c.data(h, n=8, seed=i)) for i, h in enumerate(names)}
        start = threading.Barrier(K)
        receipts, refused, second, other = {}, {}, {}, {}

        def one(h):
            cl = clients[h]
            try:
                params = cl.fetch_params()
                payload, tag = cl.protect(params, stats[h])
                start.wait(timeout=120)  # all uploads in flight together
                receipts[h] = cl.upload(params, payload, tag=tag)
                if int(h[1:]) % 10 == 0:
                    # the same payload again gets the same receipt back (idempotent), not a second count
                    again = cl.upload(params, payload, tag=tag, attempts=1)
                    if again["payload_sha256"] != receipts[h]["payload_sha256"]:
                        other[h] = "a second receipt for the same payload"
                    # a different payload from the same hospital is refused
                    other_payload, other_tag = cl.protect(params, stats[names[(int(h[1:]) + 1) % K]])
                    try:
                        cl.upload(params, other_payload, tag=other_tag, attempts=1)
                        other[h] = "second contribution accepted"
                    except SecureAFLError as e:
                        second[h] = e
            except SecureAFLError as e:
                refused[h] = e
            except Exception as e:  # noqa: BLE001 - reported by the assertions
                other[h] = f"{type(e).__name__}: {e}"

        threads = [threading.Thread(target=one, args=(h,), daemon=True) for h in names]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=120)
        assert not any(th.is_alive() for th in threads), "uploads did not finish within the bound"
        for cl in clients.values():
            cl.close()

        assert other == {}
        statuses = [getattr(e, "status_code", None) for e in refused.values()]
        assert all(s is not None and s < 500 for s in statuses), statuses
        # every refusal is a replay of an accepted upload or a busy answer under the body cap
        assert {e.reason for e in refused.values()} <= {"busy"}  # the body cap may make a hospital wait, then refuse
        assert len(second) == K // 10 and {e.reason for e in second.values()} == {"duplicate"}
        assert all(getattr(e, "status_code", 500) < 500 for e in second.values())

        conn = c.connect_keyholder()
        accepted = sorted(receipts)
        res = c.keyholder.finalize(conn, min_clients=2)
        manifest = conn.request("GET", conn.path("/manifest")).json()
        conn.close()
        assert sorted(p["hospital"] for p in manifest["participants"]) == accepted
        assert res.report["participants"] == accepted
        v = _verify_countersigned(c)
        assert v.n_receipts == len(accepted)
        records = [json.loads(line) for line in c.audit_path().read_text().splitlines() if line.strip()]
        uploads = [r["actor"] for r in records if r["event"] == "upload" and r["outcome"] == "accepted"]
        assert sorted(a.split(":")[-1] for a in uploads) == accepted  # one accepted upload record per hospital
        assert len(accepted) + sum(1 for e in refused.values() if e.reason == "busy") == K
        total = sum((stats[h] for h in accepted[1:]), stats[accepted[0]])
        assert np.isclose(res.report["contributors"], len(accepted))
        assert np.isclose(res.stats.n, total.n)
    finally:
        c.stop()


@pytest.mark.parametrize("backend", ["plain", "secagg"])
def test_bench_service_small_session_reports_every_phase(tmp_path, backend):
    from secure_afl.bench_service import format_report, run_service_bench

    r = run_service_bench(backend, 4, dim=6, classes=3, samples=8, workdir=str(tmp_path))
    assert list(r["phases"]) == ["pki", "server", "hospitals", "release"]
    assert r["contributors"] == 4 and r["w_rel_error_vs_plain"] <= 1e-12
    assert all(p["server_cpu_s"] >= 0 and p["server_peak_rss"] > 0 for n, p in r["phases"].items() if n != "pki")
    assert r["bytes_up_per_hospital"] > 0 and r["bytes_down_per_hospital"] > 0 and r["server_disk_bytes"] > 0
    assert "||W - W_plain||" in format_report(r)
