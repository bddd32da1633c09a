"""kill -9 at every bookkeeping step of acceptance and release: the restart never duplicates a record.

Each trial runs the real server role in a child process that SIGKILLs itself at
one exact point (between two durable writes), then restarts the role on the
same files and checks the audit log, the receipt and the close record.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from secure_afl import pki
from secure_afl.audit_verify import verify_log
from secure_afl.server import aggregator, closing, intake
from secure_afl.server.aggregator import open_server
from secure_afl.server.config import load_config
from secure_afl.server.audit_records import audit_head

from support import Consortium

pytestmark = [pytest.mark.security, pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[1]

_CHILD = r"""
import hashlib, os, signal, sys
import numpy as np
from secure_afl import pki
from secure_afl.backends import get_backend
from secure_afl.server import closing, intake
from secure_afl.server.aggregator import open_server
from secure_afl.server.config import load_config
from secure_afl.signing import sign_upload

config, pki_dir, point = sys.argv[1], sys.argv[2], sys.argv[3]
srv = open_server(load_config(config))

def die(*a, **k):
    os.kill(os.getpid(), signal.SIGKILL)

def upload(name, seed):
    from secure_afl.stats import StatisticsAccumulator
    lay = srv.params.layout
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((20, lay.dim))
    X *= 0.5 / np.linalg.norm(X, axis=1, keepdims=True)
    acc = StatisticsAccumulator(lay.dim, lay.n_classes, max_norm=4.0)
    acc.update(X, rng.integers(0, lay.n_classes, 20))
    s = acc.finalize(gamma=0.0)
    s.gram += np.eye(lay.dim)
    v = lay.pack(s)
    payload = get_backend(srv.params).protect(v)
    st = sign_upload(pki.load_party(pki_dir, "hospital", name).identity_key(), srv.config.session_id,
                     srv.params.digest(), hashlib.sha256(payload).digest(), name)
    return intake.submit(srv, name, st, payload)

upload("h1", 1)
real_append, real_set_meta = srv.audit.append, srv.store.set_meta
if point == "before_upload_record":
    srv.audit.append = lambda event, **kw: die() if event == "upload" else real_append(event, **kw)
elif point == "before_receipt":
    srv.store.set_receipt = die
elif point == "before_release_record":
    srv.audit.append = lambda event, **kw: die() if event == "release" else real_append(event, **kw)
elif point == "before_close_record":
    srv.store.set_meta = lambda key, value: die() if key == "audit_close" else real_set_meta(key, value)
upload("h2", 2)
closing.close(srv, "keyholder:keyholder")
sys.exit(3)  # not reached: the kill point was passed without dying
"""


@pytest.mark.parametrize("point", ["before_upload_record", "before_receipt", "before_release_record",
                                   "before_close_record"])
def test_kill9_between_durable_writes_never_duplicates_a_record(tmp_path, point):
    # Prepare
    c = Consortium(tmp_path, backend="plain", hospitals=("h1", "h2"), min_clients=2)
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}

    # Execute: the child dies by SIGKILL at the chosen point; then the role restarts on its files
    child = subprocess.run([sys.executable, "-c", _CHILD, str(c.config), str(c.pki_dir), point],
                           env=env, capture_output=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()[-2000:]
    srv = open_server(load_config(c.config))
    try:
        if point.endswith("upload_record") or point == "before_receipt":
            closing.close(srv, "keyholder:keyholder")
        closing.close(srv, "keyholder:keyholder")  # a retried close after the restart changes nothing
        receipts = [intake.receipt(srv, h) for h in ("h1", "h2")]
        head = audit_head(srv)
    finally:
        aggregator.shutdown(srv)

    # Assert: one accepted-upload record per hospital, one release, receipts and close record point at them
    records = [json.loads(x) for x in c.audit_path().read_text().splitlines()]
    accepted = [r for r in records if r["event"] == "upload" and r["outcome"] == "accepted"]
    releases = [r for r in records if r["event"] == "release"]
    assert sorted(r["actor"] for r in accepted) == ["h1", "h2"]
    assert len(releases) == 1
    assert head["close"]["seq"] == releases[0]["seq"] and head["close"]["head"] == releases[0]["hash"]
    verify_log(c.audit_path(), server_pub=pki.load_party(c.pki_dir, "server", "aggregator").identity_pub(),
               head=f"{records[-1]['seq']}:{records[-1]['hash']}", receipts=receipts)
