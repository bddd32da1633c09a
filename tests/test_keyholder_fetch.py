"""The key holder's download pipeline (keyholder/verify.py ``fetch_signed``): order, overlap, bounds, forgery.

The re-sum through the real service (forged and swapped uploads over HTTPS)
is attacked in test_keyholder_e2e.py; these tests pin the pipeline's own
properties: it yields exactly the manifest's uploads in manifest order,
really downloads several at once, holds at most 2 x fetchers payloads, and a
payload that does not hash to its signed digest stops it.
"""

from __future__ import annotations

import hashlib
import random
import threading

import pytest

from secure_afl.keyholder.verify import ServerForgery, fetch_signed


def _manifest(n: int, seed: int = 0):
    rng = random.Random(seed)
    stored = {f"h{i:03d}": rng.randbytes(rng.randrange(1, 4096)) for i in range(n)}
    participants = [{"hospital": h, "payload_sha256": hashlib.sha256(p).hexdigest()} for h, p in stored.items()]
    rng.shuffle(participants)
    return participants, stored


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("fetchers", [1, 2, 3, 8])
def test_yields_every_upload_once_in_manifest_order(seed, fetchers):
    n = random.Random(seed).randrange(0, 40)
    participants, stored = _manifest(n, seed)
    got = list(fetch_signed(participants, stored.__getitem__, fetchers))
    assert got == [(p["hospital"], stored[p["hospital"]]) for p in participants]


def test_downloads_overlap():
    participants, stored = _manifest(6)
    both_in_flight = threading.Barrier(2, timeout=20)

    def fetch(h):
        both_in_flight.wait()  # passes only if a second download is in flight at the same time
        return stored[h]

    assert len(list(fetch_signed(participants, fetch, 2))) == 6


@pytest.mark.parametrize("fetchers", [1, 2, 4])
def test_holds_at_most_two_per_fetcher(fetchers):
    participants, stored = _manifest(30)
    lock = threading.Lock()
    started, held_max = [0], [0]
    consumed = 0

    def fetch(h):
        with lock:
            started[0] += 1
            held_max[0] = max(held_max[0], started[0] - consumed)
        return stored[h]

    for _ in fetch_signed(participants, fetch, fetchers):
        consumed += 1
    assert started[0] == 30
    assert held_max[0] <= max(1, 2 * fetchers)


@pytest.mark.parametrize("fetchers", [1, 2, 4])
@pytest.mark.parametrize("position", [0, 7, 29])
def test_a_payload_that_is_not_the_signed_one_stops_the_downloads(fetchers, position):
    participants, stored = _manifest(30, seed=position)
    forged_h = participants[position]["hospital"]
    stored[forged_h] = stored[forged_h] + b"\x00"
    calls = []
    lock = threading.Lock()

    def fetch(h):
        with lock:
            calls.append(h)
        return stored[h]

    gen = fetch_signed(participants, fetch, fetchers)
    with pytest.raises(ServerForgery, match=forged_h):
        for _ in gen:
            pass
    assert len(calls) <= position + 1 + 2 * fetchers  # no download beyond the window after the forged one


def test_fetchers_must_be_positive():
    with pytest.raises(ValueError):
        list(fetch_signed([], lambda h: b"", 0))
