"""The server's Store is shared by every request thread: reads racing writes and other reads must see
committed values only.

uvicorn runs sync handlers in a thread pool, and all of them use one SQLite connection; SQLite steps a
statement with the GIL released, and Python's sqlite3 reuses one prepared statement per SQL text, so two
unserialised threads can step and reset the same statement under each other. At K = 1000 on 16 cores that
answered GET /v1/sessions with 500 (a meta value read as None, or as another row's bytes) and refused a
valid upload's statement as unusable.
"""

from __future__ import annotations

import threading

from secure_afl.server.store import Store

_THREADS = 8
_ROUNDS = 1500


def test_concurrent_reads_and_writes_see_only_committed_values(tmp_path):
    # Arrange: fixed meta values every reader checks, and writers adding uploads, messages and nonces
    store = Store(tmp_path)
    store.set_meta("created_at", 1234.5)
    store.set_meta("params_signature", {"sig": "ab" * 32})
    errors: list[str] = []
    start = threading.Barrier(2 * _THREADS)

    def reader(t: int) -> None:
        start.wait()
        try:
            for i in range(_ROUNDS):
                if store.get_meta("created_at") != 1234.5:
                    errors.append(f"reader {t}: created_at read wrong at round {i}")
                    return
                if store.get_meta("params_signature") != {"sig": "ab" * 32}:
                    errors.append(f"reader {t}: params_signature read wrong at round {i}")
                    return
                store.upload_count()
                store.has_upload(f"h{t}-{i}")
                store.has_message("advertise", f"h{t}")
        except Exception as e:  # noqa: BLE001 - any exception in a thread is the failure being looked for
            errors.append(f"reader {t}: {type(e).__name__}: {e}")

    def writer(t: int) -> None:
        start.wait()
        try:
            for i in range(_ROUNDS // 10):
                store.insert_upload(f"w{t}-{i}", "00" * 32, {"n": i})
                store.put_message("advertise", f"w{t}-{i}", b"x" * 64)
                store.claim_nonce(f"n{t}-{i}", f"w{t}")
                store.set_meta(f"progress-{t}", i)
        except Exception as e:  # noqa: BLE001
            errors.append(f"writer {t}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=reader, args=(t,)) for t in range(_THREADS)]
    threads += [threading.Thread(target=writer, args=(t,)) for t in range(_THREADS)]
    # Execute
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    # Assert: no thread saw a torn read, every write landed once
    assert not any(th.is_alive() for th in threads)
    assert errors == []
    assert store.upload_count() == _THREADS * (_ROUNDS // 10)
    uploads = store.uploads()
    assert len({u["hospital"] for u in uploads}) == len(uploads)
    assert all(u["statement"] == {"n": int(u["hospital"].split("-")[1])} for u in uploads)
    assert len(store.messages("advertise")) == _THREADS * (_ROUNDS // 10)
    store.close()


def test_verifier_messages_keep_the_first_one_and_survive_a_reopen_of_older_state(tmp_path):
    # split's kept verifier messages: one row per upload, the first kept stays (a second query's message for
    # the same upload is never stored over it), and state from before the table existed is carried over
    msg = {"payload_sha256": "ab" * 32, "query_seed": "01" * 32, "message": "m1"}
    store = Store(tmp_path)
    store.set_meta("split_verifier", {"h1": msg})  # as older servers kept them
    store.close()
    store = Store(tmp_path)
    assert store.verifier_messages() == {"h1": msg} and store.get_meta("split_verifier") is None
    store.keep_verifier_messages({"h1": {**msg, "query_seed": "02" * 32, "message": "m2"},
                                  "h2": {**msg, "message": "m3"}})
    assert store.verifier_messages(["h1"]) == {"h1": msg}
    assert store.verifier_messages(["h2", "h3"]) == {"h2": {**msg, "message": "m3"}}
    store.close()
