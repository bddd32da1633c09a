"""Hospital side of a ``secagg`` session: the five SecAgg stages over HTTPS.

The hospital polls for the server's request of the current stage, answers it
with :class:`~secure_afl.backends.secagg.SecAggClient` (which refuses
out-of-order stages, tampered shares and overlapping unmask requests), and
uploads its masked vector as a signed upload (the receipt is kept like for
any backend). Its secrets (X25519 keys, self-mask seed, shares it holds) live
only in this process.
"""

from __future__ import annotations

import base64
import logging
import time

from secure_afl.backends.secagg import SecAggClient, Stage, decode_message
from secure_afl.exceptions import InsufficientShares, StageError
from secure_afl.params import SessionParams
from secure_afl.stats import SufficientStatistics

__all__ = ["run_secagg"]

log = logging.getLogger("secure_afl.client")


def run_secagg(hospital, params: SessionParams, stats: SufficientStatistics, *, progress: bool = False,
               timeout: float = 600.0, poll: float = 0.1, stop_before: str | None = None) -> dict | None:
    """Take part in every stage; return the receipt of the masked upload.

    ``stop_before`` (a stage name) makes this hospital go silent at that
    stage, as a crashed site would: failure drills and tests use it to
    exercise dropout recovery. Returns None in that case.
    """
    conn = hospital.conn
    vector = hospital.protect_vector(params, stats)
    info = conn.info()
    cid = info["secagg"]["client_ids"][hospital.name]
    client = SecAggClient(params, cid)
    receipt = None
    deadline = time.monotonic() + timeout
    answered = set()
    while time.monotonic() < deadline:
        r = conn.request("GET", conn.path("/secagg/request")).json()
        stage = r["stage"]
        if stage == "done":
            return receipt
        if stage == "aborted":
            raise InsufficientShares("the server aborted the secagg round (too many dropouts); nothing was revealed")
        if r.get("dropped"):
            raise StageError(f"{hospital.name} was dropped from the round at stage {stage}")
        if "request" not in r or stage in answered:
            time.sleep(poll)
            continue
        if stop_before == stage:
            log.warning("%s goes silent before %s (drill)", hospital.name, stage)
            return None
        request = decode_message(base64.b64decode(r["request"]))
        response = client.handle(request, vector=vector if stage == Stage.MASKED_INPUT else None)
        if stage == Stage.MASKED_INPUT:
            receipt = hospital.upload(params, response.to_bytes(), progress=progress)
        else:
            body = response.to_bytes()
            conn.request("POST", conn.path(f"/secagg/{stage}"), body=body)
            hospital.bytes_uploaded += len(body)
        answered.add(stage)
        log.info("[Stage %d] %s answered %s", Stage.index(stage), hospital.name, stage)
    raise TimeoutError(f"secagg round did not finish within {timeout:.0f} s")
