"""A dropped connection during the upload, through the hospital's own submit.

A TCP relay on 127.0.0.1 sits between the hospital and the real server
process (TLS passes through it untouched) and cuts the one connection that
carries the upload body: either after the server answered (the upload
landed, the receipt was lost) or before the body reached it (nothing
landed). The client must find out which from the receipt, and POST again
only in the second case.
"""

from __future__ import annotations

import json
import socket
import threading

import pytest

from support import Consortium

pytestmark = pytest.mark.e2e

# the plain payload at d = 64 is ~18 kB; every other request stays far below this
BODY_THRESHOLD = 8000


class CuttingRelay:
    """Relays 127.0.0.1 TCP connections to ``target_port`` and cuts the first one that carries a body.

    ``mode="response"``: the body is delivered, the server's answer is not.
    ``mode="request"``: the connection is cut before the body reaches the server.
    """

    def __init__(self, target_port: int, mode: str):
        self.target_port, self.mode = target_port, mode
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.body_connections = 0
        self.cut = False
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self.listener.accept()
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", self.target_port))
            state = {"sent": 0, "body": False}
            threading.Thread(target=self._pump_up, args=(down, up, state), daemon=True).start()
            threading.Thread(target=self._pump_down, args=(up, down, state), daemon=True).start()

    def _should_cut(self, state) -> bool:
        with self._lock:
            if self.cut or not state["body"]:
                return False
            self.cut = True
            return True

    @staticmethod
    def _kill(*socks) -> None:
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def _pump_up(self, down, up, state) -> None:
        try:
            while chunk := down.recv(65536):
                state["sent"] += len(chunk)
                if state["sent"] > BODY_THRESHOLD and not state["body"]:
                    state["body"] = True
                    with self._lock:
                        self.body_connections += 1
                    if self.mode == "request" and self._should_cut(state):
                        self._kill(down, up)
                        return
                up.sendall(chunk)
        except OSError:
            pass
        self._kill(down, up)

    def _pump_down(self, up, down, state) -> None:
        try:
            while chunk := up.recv(65536):
                if self.mode == "response" and self._should_cut(state):
                    self._kill(down, up)
                    return
                down.sendall(chunk)
        except OSError:
            pass
        self._kill(down, up)


@pytest.fixture
def session(tmp_path):
    c = Consortium(tmp_path / "c", backend="plain", hospitals=("h1", "h2"), dim=64, classes=3,
                   min_clients=2).start()
    yield c
    c.stop()


def _uploads_in_audit(c: Consortium) -> list[dict]:
    records = [json.loads(line) for line in c.audit_path().read_text().splitlines()]
    return [r for r in records if r.get("event") == "upload"]


def _submit_through(c: Consortium, relay: CuttingRelay) -> dict:
    from secure_afl import pki
    from secure_afl.clients.hospital import HospitalClient

    client = HospitalClient(f"https://127.0.0.1:{relay.port}", c.session_id,
                            pki.load_party(c.pki_dir, "hospital", "h1"), receipts_dir=c.root / "receipts",
                            timeout=30)
    try:
        return client.submit(c.stats(*c.data("h1")))
    finally:
        client.close()


def test_response_dropped_after_commit_is_one_post_then_the_receipt(session):
    # Prepare
    relay = CuttingRelay(session.port, "response")

    # Execute
    receipt = _submit_through(session, relay)
    relay.close()

    # Assert: one POST, resolved by the receipt lookup; nothing refused, nothing sent twice
    assert relay.cut and relay.body_connections == 1
    assert receipt["hospital"] == "h1"
    uploads = _uploads_in_audit(session)
    assert [(u["actor"], u["outcome"]) for u in uploads] == [("h1", "accepted")]
    with session.connect_keyholder() as conn:
        assert conn.status()["uploaded"] == ["h1"]


def test_request_cut_before_the_server_saw_it_is_posted_again(session):
    # Prepare
    relay = CuttingRelay(session.port, "request")

    # Execute
    receipt = _submit_through(session, relay)
    relay.close()

    # Assert: the receipt lookup says "not found", so the upload is sent once more and lands once.
    # The server authenticates an upload from its headers before it reads the body, so the cut
    # body may leave one audited refusal (reason "disconnected") under h1's name before it.
    assert relay.cut and relay.body_connections == 2
    assert receipt["hospital"] == "h1"
    uploads = [(u["actor"], u["outcome"], u.get("reason")) for u in _uploads_in_audit(session)]
    assert uploads[-1][:2] == ("h1", "accepted")
    assert uploads[:-1] in ([], [("h1", "refused", "disconnected")]), uploads
    with session.connect_keyholder() as conn:
        assert conn.status()["uploaded"] == ["h1"]
