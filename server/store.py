"""Durable server state: SQLite (WAL) plus content-addressed payload files.

Runs on: the aggregation server. Sees: protected payloads only (ciphertexts
or masked vectors), signatures, and, for ``plain``, plaintext statistics.

Durability contract: a contribution is acknowledged (receipt) only after its
payload file is fsync'ed and renamed into place, its row is committed, and its
audit record is fsync'ed. A SIGKILL at any point loses no acknowledged upload;
an upload killed before its commit was never acknowledged and the hospital may
send it again (its nonce was not recorded either).
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from pathlib import Path

from secure_afl._io import fsync_dir, write_file

__all__ = ["Store"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS uploads (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    hospital TEXT NOT NULL UNIQUE,
    payload_sha256 TEXT NOT NULL,
    statement TEXT NOT NULL,
    received_at REAL NOT NULL,
    audit_seq INTEGER,
    receipt TEXT,
    tag TEXT
);
CREATE TABLE IF NOT EXISTS verifier_messages (
    hospital TEXT PRIMARY KEY, payload_sha256 TEXT NOT NULL, query_seed TEXT NOT NULL, message TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS nonces (nonce TEXT PRIMARY KEY, party TEXT NOT NULL, seen_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS messages (
    stage TEXT NOT NULL, party TEXT NOT NULL, data BLOB NOT NULL, received_at REAL NOT NULL, auth TEXT,
    PRIMARY KEY (stage, party)
);
"""


class Store:
    def __init__(self, directory):
        self.dir = Path(directory)
        self.payload_dir = self.dir / "payloads"
        self.payload_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._lock = threading.RLock()
        self.db = sqlite3.connect(self.dir / "state.sqlite3", check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(_SCHEMA)
        legacy = self.get_meta("split_verifier")
        if legacy:  # state written before the messages had a table: each kept message stays kept
            self.keep_verifier_messages(legacy)
            with self._lock:
                self.db.execute("DELETE FROM meta WHERE key='split_verifier'")

    def close(self) -> None:
        with self._lock:
            self.db.close()

    # -- meta ----------------------------------------------------------------
    def _rows(self, sql: str, args: tuple = ()) -> list:
        """Every row of a read, stepped under the lock.

        All request threads share this one connection, and sqlite3 reuses a prepared statement per SQL text
        while SQLite steps it with the GIL released: two unserialised reads of the same query can reset
        each other's statement (seen at K = 1000 on 16 cores as a meta row read as missing or as another
        row's value). Every write already held the lock; a read holds it for one query.
        """
        with self._lock:
            return self.db.execute(sql, args).fetchall()

    def get_meta(self, key: str, default=None):
        rows = self._rows("SELECT value FROM meta WHERE key=?", (key,))
        return json.loads(rows[0][0]) if rows else default

    def set_meta(self, key: str, value) -> None:
        with self._lock:
            self.db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, json.dumps(value)))

    # -- blobs ---------------------------------------------------------------
    def put_blob(self, data: bytes, digest: str | None = None) -> str:
        """Write ``data`` under its SHA-256 (``digest`` where the caller computed it from these bytes), durably;
        idempotent."""
        digest = hashlib.sha256(data).hexdigest() if digest is None else digest
        final = self.payload_dir / digest
        if final.exists():
            return digest
        tmp = self.payload_dir / f".{digest}.{os.getpid()}.{threading.get_ident()}.tmp"
        write_file(tmp, data, exclusive=False)
        os.replace(tmp, final)
        fsync_dir(self.payload_dir)
        return digest

    def blob_path(self, digest: str) -> Path:
        """Where the payload with this SHA-256 is kept (a reader checks the digest, as :meth:`get_blob` does)."""
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError("a payload digest is 64 lowercase hex characters")
        return self.payload_dir / digest

    def get_blob(self, digest: str) -> bytes:
        data = (self.payload_dir / digest).read_bytes()
        if hashlib.sha256(data).hexdigest() != digest:
            raise OSError(f"payload file {digest} is corrupt")
        return data

    # -- nonces (replay protection across restarts) -----------------------------
    def claim_nonce(self, nonce: str, party: str) -> bool:
        """Record a nonce; False if it was seen before."""
        with self._lock:
            try:
                self.db.execute("INSERT INTO nonces(nonce, party, seen_at) VALUES (?, ?, ?)",
                                (nonce, party, time.time()))
                return True
            except sqlite3.IntegrityError:
                return False

    def release_nonce(self, nonce: str, party: str) -> None:
        """Forget a nonce claimed by ``party`` for a request the server failed to finish (not the sender's
        fault), so the same signed request can be sent again; nothing was accepted under it."""
        with self._lock:
            self.db.execute("DELETE FROM nonces WHERE nonce = ? AND party = ?", (nonce, party))

    # -- uploads -------------------------------------------------------------
    def has_upload(self, hospital: str) -> bool:
        return bool(self._rows("SELECT 1 FROM uploads WHERE hospital=?", (hospital,)))

    def insert_upload(self, hospital: str, payload_sha256: str, statement: dict, tag: dict | None = None) -> int:
        with self._lock:
            cur = self.db.execute(
                "INSERT INTO uploads(hospital, payload_sha256, statement, received_at, tag) VALUES (?, ?, ?, ?, ?)",
                (hospital, payload_sha256, json.dumps(statement), time.time(),
                 None if tag is None else json.dumps(tag)))
            return int(cur.lastrowid)

    def set_receipt(self, hospital: str, audit_seq: int, receipt: dict) -> None:
        with self._lock:
            self.db.execute("UPDATE uploads SET audit_seq=?, receipt=? WHERE hospital=?",
                            (audit_seq, json.dumps(receipt), hospital))

    def uploads(self) -> list[dict]:
        rows = self._rows(
            "SELECT seq, hospital, payload_sha256, statement, audit_seq, receipt, tag FROM uploads ORDER BY seq")
        return [{"seq": r[0], "hospital": r[1], "payload_sha256": r[2], "statement": json.loads(r[3]),
                 "audit_seq": r[4], "receipt": json.loads(r[5]) if r[5] else None,
                 "tag": json.loads(r[6]) if r[6] else None} for r in rows]

    def upload_tags(self, hospitals=None, *, after: int = 0) -> dict[str, tuple[str, dict | None]]:
        """hospital -> (payload_sha256, tag) of the uploads named (all when None), or of those after the first
        ``after`` in arrival order: one row per upload read, not the whole table, so a verifier polling a
        large session pays for what is new."""
        if hospitals is None:
            rows = self._rows("SELECT hospital, payload_sha256, tag FROM uploads ORDER BY seq LIMIT -1 OFFSET ?",
                              (int(after),))
        else:
            names, rows = list(hospitals), []
            for i in range(0, len(names), 500):  # within SQLite's bound on parameters per statement
                part = names[i:i + 500]
                rows += self._rows("SELECT hospital, payload_sha256, tag FROM uploads WHERE hospital IN "
                                   f"({','.join('?' * len(part))})", tuple(part))
        return {r[0]: (r[1], json.loads(r[2]) if r[2] else None) for r in rows}

    def verifier_messages(self, hospitals=None) -> dict:
        """hospital -> the kept verifier message of its upload (those named, or all)."""
        if hospitals is None:
            rows = self._rows("SELECT hospital, message FROM verifier_messages")
        else:
            names, rows = list(hospitals), []
            for i in range(0, len(names), 500):
                part = names[i:i + 500]
                rows += self._rows("SELECT hospital, message FROM verifier_messages WHERE hospital IN "
                                   f"({','.join('?' * len(part))})", tuple(part))
        return {r[0]: json.loads(r[1]) for r in rows}

    def judged_hospitals(self) -> list[str]:
        """The hospitals whose upload has a kept verifier message (the messages themselves are not read)."""
        return [r[0] for r in self._rows("SELECT hospital FROM verifier_messages")]

    def keep_verifier_messages(self, messages: dict) -> None:
        """Keep each message unless its upload has one already (the first one formed stays), in one
        transaction."""
        with self._lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                self.db.executemany(
                    "INSERT OR IGNORE INTO verifier_messages(hospital, payload_sha256, query_seed, message) "
                    "VALUES (?, ?, ?, ?)", [(h, m["payload_sha256"], m["query_seed"], json.dumps(m))
                                            for h, m in messages.items()])
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise

    def retire_uploads(self, label: str, meta: dict) -> int:
        """Move every upload row into ``messages`` under stage ``label`` and set ``meta``, in one transaction.

        For a protocol round that aborted: its uploads stay on record (rows and
        payload files) but no longer count, and a crash leaves either the old
        round or the new one, never a mix.
        """
        with self._lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                cur = self.db.execute(
                    "INSERT INTO messages(stage, party, data, received_at) SELECT ?, hospital, "
                    "CAST(json_object('payload_sha256', payload_sha256, 'audit_seq', audit_seq) AS BLOB), received_at "
                    "FROM uploads", (label,))
                moved = cur.rowcount
                self.db.execute("DELETE FROM uploads")
                for key, value in meta.items():
                    self.db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, json.dumps(value)))
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            return int(moved)

    def upload_count(self) -> int:
        return int(self._rows("SELECT COUNT(*) FROM uploads")[0][0])

    # -- protocol messages (secagg stages) ---------------------------------------
    def put_message(self, stage: str, party: str, data: bytes, auth: dict | None = None) -> bool:
        """Store one protocol message and, optionally, the sender's request signature over it."""
        with self._lock:
            try:
                self.db.execute(
                    "INSERT INTO messages(stage, party, data, received_at, auth) VALUES (?, ?, ?, ?, ?)",
                    (stage, party, data, time.time(), None if auth is None else json.dumps(auth)))
                return True
            except sqlite3.IntegrityError:
                return False

    def has_message(self, stage: str, party: str) -> bool:
        return bool(self._rows("SELECT 1 FROM messages WHERE stage=? AND party=?", (stage, party)))

    def messages(self, stage: str) -> dict[str, bytes]:
        rows = self._rows("SELECT party, data FROM messages WHERE stage=? ORDER BY party", (stage,))
        return {r[0]: bytes(r[1]) for r in rows}

