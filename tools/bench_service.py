"""``secure-afl bench service``: one session through the real service, timed per phase.

Everything is the production path on 127.0.0.1: a ``secure-afl server run``
child process (uvicorn, mTLS), the key holder (:class:`secure_afl.keyholder.KeyHolder`:
keygen and publish for ckks/bfv, then close, verify, reveal and solve), and K
:class:`HospitalClient` instances over HTTPS (secagg hospitals run their whole
SecAgg participant loop). The hospitals run in one worker process per core
(``--processes``), each running its slice as threads, ``_UPLOADING_PER_PROCESS``
at once (secagg: its whole slice, a stage waits for everyone), so K = 1000 is
not held back by one interpreter's GIL nor by K contributions in memory at
once, and the uploads arrive as a stream, not in waves. Phases:

* ``pki``        consortium CA, server, key holder and K hospital identities;
* ``server``     server start until ``/v1/health`` answers;
* ``keys``       (ckks, bfv) the key holder's keygen and publication;
* ``hospitals``  K hospitals fetch the parameters, protect, sign, upload (secagg:
                 every stage of the round, the server's unmasking included); split: it ends once the
                 key holder's judging loop holds every expected upload, and the benchmark's hospital
                 processes exit while the judging and the release run (the report says when);
* ``judging``    (split) the key holder judges what the uploads' last burst left, as a session whose
                 deadline falls after its last upload does before the release;
* ``release``    the key holder closes the round, verifies the manifest, reveals and solves W.

For every phase it prints the wall time, the server's CPU seconds (utime +
stime from ``/proc/PID/stat``, its child processes included: the summing
workers of ``[server] combine_workers``), its peak RSS (``VmHWM``, reset at
the start of each phase through ``/proc/PID/clear_refs`` where the kernel
allows it, else the peak so far) and the summing workers' RSS at the end of
the phase; secagg adds each stage's duration and answers from the server's
audit log. At the end: the bytes up and down per hospital (request and
response bodies), each hospital thread's own CPU time (mean, max), the disk
used by the server's data directory and ``||W - W_plain|| / ||W_plain||``
against the plaintext solve
of the same hospitals' statistics.

Hospitals with synthetic embeddings (``--samples`` rows each, ``||x|| <= 1``)
stand in for real ones: the service's cost does not depend on where the
statistics come from. ``--dropout F`` makes a fraction F of the hospitals drop
out: with plain/ckks/bfv they never upload; with secagg they share their keys
and then go silent before the masked input (the server drops them after
``--stage-timeout`` seconds and the survivors unmask their pairwise masks).

The server runs with its default limits (k_max + 16 connections, 4 bodies
read at once): hospitals wait on their connections for a body slot; a 429
``busy`` (no slot within ``read_timeout_s``) or a 503 (``--max-connections``
below K) is absorbed by waiting and sending again (transport/tls_client.py), and
the report counts them.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue as queue_mod
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from secure_afl.backends import HE_BACKENDS
from secure_afl.backends import get_backend
from secure_afl.keyholder.verify import default_fetchers, resum_signed_contributions
from secure_afl.packing import Layout
from secure_afl.secagg import Stage
from secure_afl.secagg import default_threshold, max_min_clients, recommended_neighbours
from secure_afl.server.config import load_config
from secure_afl.stats import StatisticsAccumulator
from secure_afl.stats import SufficientStatistics
from secure_afl_tools.harness import Judging, ServerProcess, make_pki, server_section, write_session

__all__ = ["register", "run_service_bench", "ServerMeter"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
#: secagg: at most this many hospitals per worker process (a stage waits for every hospital, so a process runs its
#: whole slice at once).
_THREADS_PER_PROCESS = 100
#: plain, ckks, bfv, split: hospitals one worker process runs at once. Enough to overlap one hospital's upload and
#: its wait for a body slot with another's proving, few enough that the uploads arrive as a stream. Hospitals
#: that start together finish together: with 100 at once per process the arrivals came in waves (at K = 1000,
#: d = 512, 215 of the 1000 split uploads in the phase's last tenth), a burst no deployment's hospitals
#: synchronise into, and each process held 6.5 GB.
_UPLOADING_PER_PROCESS = 4


def _stat(pid) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _proc_status(pid, key: str) -> int:
    """A size field of /proc/PID/status (VmRSS, VmHWM) in bytes; 0 if absent."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


class ServerMeter:
    """CPU seconds and peak RSS of one process and its child processes (the summing workers), from /proc."""

    def __init__(self, pid: int):
        self.pid = pid

    def children(self) -> list[int]:
        out = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if int(_stat(entry.name)[1]) == self.pid:  # field 4, ppid
                        out.append(int(entry.name))
                except (OSError, IndexError, ValueError):
                    continue
        return out

    def cpu_s(self) -> float:
        """utime + stime of the process, of its children that ended (cutime, cstime) and of those running."""
        f = _stat(self.pid)
        ticks = sum(int(x) for x in f[11:15])  # fields 14-17
        for child in self.children():
            try:
                ticks += sum(int(x) for x in _stat(child)[11:15])
            except (OSError, IndexError, ValueError):
                continue  # ended between the listing and the read: counted in cutime next time
        return ticks / _TICK

    def children_rss(self) -> int:
        """Summed RSS of the running child processes (the summing workers hold the partial sums)."""
        total = 0
        for child in self.children():
            try:
                total += _proc_status(child, "VmRSS")
            except OSError:
                continue  # ended between the listing and the read
        return total

    def rss(self) -> int:
        return _proc_status(self.pid, "VmRSS")

    def peak_rss(self) -> int:
        return _proc_status(self.pid, "VmHWM")

    def reset_peak(self) -> bool:
        """Reset VmHWM to the current RSS (Linux >= 4.0, own processes); False where refused."""
        try:
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")
            return True
        except OSError:
            return False


def _disk_used(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


def hospital_stats(dim: int, classes: int, samples: int, seed: int, k: int):

    rng = np.random.default_rng([seed, k])
    X = rng.standard_normal((samples, dim))
    X *= (rng.uniform(0.5, 1.0, samples) / np.linalg.norm(X, axis=1))[:, None]
    y = rng.integers(0, classes, samples)
    acc = StatisticsAccumulator(dim, classes, max_norm=1.0)
    acc.update(X, y)
    return acc.finalize(gamma=0.0)


def run_service_bench(backend: str, hospitals: int, *, dim: int = 64, classes: int = 10, samples: int = 32,
                      dropout: float = 0.0, seed: int = 0, workdir: str | None = None,
                      stage_timeout_s: float = 60.0, hospital_timeout_s: float = 1800.0,
                      processes: int | None = None, compare_fetchers: bool = False,
                      max_connections: int | None = None, combine_workers: int = 0,
                      split_section: dict | None = None, progress=None) -> dict:
    """The real service end to end; ``compare_fetchers`` also times the key holder's verify + re-sum over
    HTTPS again with one download at a time and with the default number in flight (no decryption).
    ``split_section``: the session's signed ``[split]`` keys (field, gram_proof), for split only.
    ``progress``: called with a line as each phase starts and every ``_PROGRESS_S`` of the hospitals' phase."""
    from secure_afl.analytic import solve_from_sums
    from secure_afl.clients.hospital import HospitalClient
    from secure_afl.keyholder import KeyHolder

    K = hospitals
    if K < 2:
        raise SystemExit("--hospitals must be >= 2")
    if not 0.0 <= dropout < 0.5:
        raise SystemExit("--dropout must be in [0, 0.5)")
    rng = np.random.default_rng(seed)
    n_drop = int(round(dropout * K))
    dropped = set(int(i) for i in rng.choice(K, n_drop, replace=False))
    names = [f"h{i:04d}" for i in range(K)]
    work = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="secure-afl-bench-service-"))
    work.mkdir(parents=True, exist_ok=True)
    pki_dir = work / "pki"
    phases: dict[str, dict] = {}
    say = progress or (lambda line: None)

    t = time.perf_counter()
    say(f"pki: a consortium of {K} hospitals")
    # every party reads the consortium from a CA-signed roster, as from its bundle (one file and one signature
    # check, not one enrolment file per hospital: 10 ms instead of 85 ms per hospital at K = 1000)
    make_pki(pki_dir, names, name="secure-afl bench consortium", roster=True)
    phases["pki"] = {"wall_s": time.perf_counter() - t}

    survivors = K - n_drop
    min_clients = survivors
    cfg = {
        "session": {"id": f"bench-{backend}-{K}", "backend": backend, "dim": dim, "classes": classes,
                    "gamma": 1.0, "min_clients": min_clients, "min_class_count": 1, "deadline_s": 86400,
                    "hospitals": names},
        "bounds": {"max_norm": 1.0, "n_max": samples, "k_max": K},
        "server": {**server_section(work, pki_dir), "max_connections": int(max_connections or 0),
                   "combine_workers": int(combine_workers)},
    }
    if backend == "split" and split_section:
        cfg["split"] = dict(split_section)
    if backend == "secagg":  # a [secagg] section in another backend's session is refused
        cfg["secagg"] = {"stage_timeout_s": float(stage_timeout_s)}

        k = recommended_neighbours(K)
        thr = default_threshold((K - 1 if k is None else k) + 1)
        # the consistency quorum max((K + t - 1) // 2 + 1, min_clients + t - 1) must fit in the survivors
        min_clients = max(1, min(survivors - thr + 1, max_min_clients(K, thr)))
        if (K + thr - 1) // 2 + 1 > survivors:
            raise SystemExit(f"--dropout {dropout:g} leaves {survivors} of {K}: below the consistency quorum "
                             f"{(K + thr - 1) // 2 + 1} of threshold {thr}; the round would abort")
        cfg["session"]["min_clients"] = min_clients
    session_id = cfg["session"]["id"]
    write_session(work / "session.toml", pki_dir, cfg)  # the operator's signature every party pins
    url = f"https://127.0.0.1:{cfg['server']['port']}"
    kh = KeyHolder(pki_dir, "keyholder", work / "keyholder", passphrase=os.urandom(16).hex().encode())
    server = ServerProcess(work / "session.toml", work / "server.log")
    busy = {"hospitals": 0, "keyholder": 0}
    meter = fleet = None

    def phase(name, fn):
        say(f"{name} ...")
        peak_reset = meter.reset_peak()
        cpu0, t0 = meter.cpu_s(), time.perf_counter()
        out = fn()
        phases[name] = {"wall_s": time.perf_counter() - t0, "server_cpu_s": meter.cpu_s() - cpu0,
                        "server_peak_rss": meter.peak_rss(), "peak_is_phase": peak_reset,
                        "server_children_rss": meter.children_rss()}
        return out

    try:
        t = time.perf_counter()
        say("server: starting it and waiting for /v1/health")
        server.start()
        meter = ServerMeter(server.proc.pid)
        server.wait_ready(url, kh.party.ca_file, (kh.party.cert_file, kh.party.key_file), timeout=120)
        phases["server"] = {"wall_s": time.perf_counter() - t, "server_cpu_s": meter.cpu_s(),
                            "server_peak_rss": meter.peak_rss(), "peak_is_phase": True}
        conn = kh.connect(url, session_id)
        if backend in HE_BACKENDS or backend == "split":
            def keys():
                params0 = load_config(work / "session.toml").definition.session_params()  # as the server
                kh.keygen(params0)
                kh.publish(conn)

            phase("keys", keys)

        job = {"url": url, "session_id": session_id, "pki_dir": str(pki_dir), "receipts": str(work / "receipts"),
               "backend": backend, "dim": dim, "classes": classes, "samples": samples, "seed": seed,
               "timeout": hospital_timeout_s}
        n_proc = max(1, min(processes or _default_processes(backend, K), K))

        fleet = _HospitalFleet(job, [[(i, names[i], i in dropped) for i in range(j, K, n_proc)]
                                     for j in range(n_proc)],
                               # the idle class runs hospitals on what the parties and any other job leave: at
                               # K = 1000, d = 512 a run beside other jobs passed a bound of 1 920 s
                               hospital_timeout_s + 120 + 2.0 * K)
        audit_path = work / "server" / session_id / "audit.jsonl"

        def hospitals_progress():
            if not audit_path.exists():
                return
            done = (f"{len(_secagg_stages(audit_path))} secagg stages closed" if backend == "secagg" else
                    f"{sum(_uploads_counted(audit_path).values())} of {survivors} uploads accepted")
            say(f"hospitals: {time.time() - hospitals_t0:.0f} s, {done}"
                + (f", {judging.uploads} judged by the key holder" if backend == "split" else ""))

        with Judging(kh, url, session_id, enabled=backend == "split") as judging:
            hospitals_t0 = time.time()
            # split: the release starts once the key holder's judging holds every expected upload, as a key holder
            # whose roster has all uploaded would start it, not when the benchmark's hospital processes exit
            phase("hospitals", lambda: fleet.run(until=(lambda: judging.uploads >= survivors)
                                                 if backend == "split" else None, tick=hospitals_progress))
            if backend == "split":
                phases["hospitals"]["keyholder_judged_while_open"] = judging.uploads
                accepted = len(conn.status()["uploaded"])

                def judging_phase():  # the loop's pass in flight when the uploads stopped counts here too
                    judging.stop()
                    judging.catch_up(accepted)

                phase("judging", judging_phase)
        if backend == "secagg":
            phases["hospitals"]["stages"] = _secagg_stages(work / "server" / session_id / "audit.jsonl")
        fleet.raise_errors()
        res = phase("release", lambda: kh.finalize(conn, min_clients=min_clients))
        released_at = time.time()
        fleet.finish()  # the hospitals' processes exit (their receipts, their memory) while the parties work
        fleet.raise_errors()
        phases["hospitals"]["processes_ended_after_release_s"] = fleet.ended_at - released_at
        if backend == "split":
            phases["judging"]["timeline"] = _judging_timeline(work / "server" / session_id / "audit.jsonl",
                                                              judging.judged_at, hospitals_t0, released_at)
        busy["keyholder"] = conn.busy_retries
        results, busy["hospitals"] = fleet.results, fleet.busy_retries
        conn.close()
        phases["release"]["contributors"] = res.report.get("contributors")
        if "verify_and_resum_seconds" in res.report:
            phases["release"]["keyholder_resum_s"] = res.report["verify_and_resum_seconds"]
        if "keyholder_share_seconds" in res.report:
            phases["release"]["keyholder_share_s"] = res.report["keyholder_share_seconds"]
            for k in ("server_verifier_seconds", "judge_and_share_seconds"):
                phases["release"][k.replace("_seconds", "_s")] = res.report[k]
        if compare_fetchers and backend in HE_BACKENDS:
            phases["release"]["resum_s_by_fetchers"] = _resum_by_fetchers(kh, kh.connect(url, session_id))
        disk = _disk_used(work / "server")
    finally:
        if fleet is not None:
            fleet.stop()
        server.stop()
    counted = None if backend == "secagg" else _uploads_counted(work / "server" / session_id / "audit.jsonl")

    # W error against the plaintext solve of the same hospitals' statistics
    say("W against the plaintext solve of the same hospitals' statistics ...")
    included = sorted(res.report["participants"]) if "participants" in res.report else \
        [n for i, n in enumerate(names) if i not in dropped]
    plain_sum = None  # one hospital's statistics at a time: O(L) memory
    for n in included:
        s_n = _with_gamma(hospital_stats(dim, classes, samples, seed, names.index(n)))
        plain_sum = s_n if plain_sum is None else plain_sum + s_n
    W_plain = solve_from_sums(plain_sum)
    w_err = float(np.linalg.norm(res.W - W_plain) / np.linalg.norm(W_plain))
    up = np.array([v[0] for v in results.values()], dtype=np.float64)
    down = np.array([v[1] for v in results.values()], dtype=np.float64)
    cpu = np.array([v[2] for v in results.values()], dtype=np.float64)
    return {
        "backend": backend, "hospitals": K, "dropped": n_drop, "contributors": len(included),
        "dim": dim, "classes": classes, "length": Layout(dim, classes).length, "samples": samples,
        "min_clients": min_clients, "phases": phases, "split": cfg.get("split"),
        "bytes_up_per_hospital": float(up.mean()) if len(up) else 0.0,
        "bytes_down_per_hospital": float(down.mean()) if len(down) else 0.0,
        "hospital_cpu_s": {"mean": float(cpu.mean()), "max": float(cpu.max())} if len(cpu) else None,
        "hospitals_measured": len(results),
        "server_disk_bytes": disk, "w_rel_error_vs_plain": w_err, "busy_retries": busy,
        "uploads_counted": None if counted is None else {
            "accepted_records": sum(counted.values()), "hospitals": len(counted),
            "each_once": sorted(counted) == sorted(included) and set(counted.values()) <= {1}},
        "hospital_processes": n_proc, "max_connections": load_config(work / "session.toml").connection_limit,
        "combine_workers": cfg["server"]["combine_workers"],
        "cpus": os.cpu_count(), "workdir": str(work),
    }


def _audit_records(audit_path: Path):
    """The server's audit records, in order; a line the server is still writing (no newline yet) is not one."""
    with open(audit_path, "rb") as fh:
        for line in fh:
            if not line.endswith(b"\n"):
                return
            yield json.loads(line)


def _uploads_counted(audit_path: Path) -> dict[str, int]:
    """Accepted upload records per hospital in the server's audit log (each survivor must appear once)."""
    counts: dict[str, int] = {}
    for rec in _audit_records(audit_path):
        if rec["event"] == "upload" and rec["outcome"] == "accepted":
            counts[rec["actor"]] = counts.get(rec["actor"], 0) + 1
    return counts


def _judging_timeline(audit_path: Path, judged_at: dict, t0: float, released: float) -> dict:
    """When the uploads arrived (the server's accepted-upload records), how long each waited for the key
    holder's verdict, and the release's end after the last upload, in seconds from the start of the
    hospitals' phase (``t0``; ``released``: the release's end, both ``time.time()``)."""
    from datetime import datetime

    arrived = {}
    for rec in _audit_records(audit_path):
        if rec["event"] == "upload" and rec["outcome"] == "accepted":
            arrived[rec["actor"].partition(":")[2] or rec["actor"]] = \
                datetime.fromisoformat(rec["time"].replace("Z", "+00:00")).timestamp() - t0
    if not arrived:
        return {}
    times = np.sort(np.array(list(arrived.values())))
    lags = np.array([judged_at[h] - t0 - a for h, a in arrived.items() if h in judged_at])
    return {"first_arrival_s": float(times[0]), "median_arrival_s": float(np.median(times)),
            "last_arrival_s": float(times[-1]), "released_after_last_upload_s": released - t0 - float(times[-1]),
            "lag_s": {"median": float(np.median(lags)), "p90": float(np.percentile(lags, 90)),
                      "max": float(lags.max())} if len(lags) else None,
            "arrivals_per_tenth": np.histogram(times, bins=10, range=(0.0, float(times[-1]) or 1.0))[0].tolist()}


def _default_processes(backend: str, K: int) -> int:
    """The cores; for secagg, also at least one process per ``_THREADS_PER_PROCESS`` hospitals. A secagg stage
    waits for every hospital, so a process runs its whole slice at once: at K = 1000 in 2 processes, 500 threads
    each parsing a 340 kB share-keys request and checking 1000 signatures gave no answer within 600 s, while 8
    processes of 125 answered 957 of 1000 in 3 min 11 s."""
    cores = os.cpu_count() or 1
    if backend == "secagg":
        return max(cores, -(-K // _THREADS_PER_PROCESS))
    return cores


def _secagg_stages(audit_path: Path) -> list[dict]:
    """Each closed secagg stage from the server's audit log: seconds since the previous closing (or the round's
    opening), who answered of how many expected, and the outcome."""
    from datetime import datetime

    out, last = [], None
    for rec in _audit_records(audit_path):
        if rec["event"] not in ("secagg_round_opened", "secagg_stage_closed"):
            continue
        t = datetime.fromisoformat(rec["time"].replace("Z", "+00:00")).timestamp()
        d = rec.get("details") or {}
        if rec["event"] == "secagg_stage_closed":
            out.append({"round": d.get("round"), "stage": d.get("stage"), "seconds": t - last,
                        "answered": d.get("answered"), "expected": d.get("expected"),
                        "outcome": rec["outcome"]})
        last = t
    return out


def _resum_by_fetchers(kh, conn) -> dict[int, float]:
    """Seconds for the key holder's verify + re-sum of the stored uploads, fetched over HTTPS with
    1 and :func:`default_fetchers` downloads in flight; the two sums must be the same ciphertext."""
    from secure_afl.keyholder.release import HTTPSource

    params = kh.params(conn.session_id)
    backend = get_backend(params)
    ctx = backend.keyholder_context(kh.secret_context(conn.session_id))
    source = HTTPSource(conn)
    manifest = source.manifest()
    seconds, sums = {}, set()
    try:
        for f in sorted({1, default_fetchers()}):
            t = time.perf_counter()
            chunks, _ = resum_signed_contributions(params, backend, ctx, manifest, source.contribution, fetchers=f)
            seconds[f] = time.perf_counter() - t
            sums.add(b"".join(c.serialize() for c in chunks))
    finally:
        conn.close()
    if len(sums) != 1:
        raise RuntimeError("the re-sums with different download counts differ")
    return seconds


class _HospitalFleet:
    """The hospitals' worker processes (one slice each, :func:`_hospital_slice`) and what they report.

    :meth:`run` returns when every process has ended, or, sooner, when ``until()`` says the key holder holds
    every expected upload: the release does not wait for the benchmark's own processes to exit (at K = 1000,
    d = 512 each held 6.5 GB and ended 5.5 s after the last upload). :meth:`finish` collects the rest."""

    _POLL_S = 0.25
    _PROGRESS_S = 10.0

    def __init__(self, job: dict, slices: list, timeout_s: float):
        ctx = mp.get_context("spawn")
        self._out = ctx.Queue()
        self._procs = [ctx.Process(target=_hospital_slice, args=(job, sl, self._out), daemon=True) for sl in slices]
        self._timeout_s, self._deadline = timeout_s, None
        self._reported = 0
        self.results: dict[str, tuple] = {}
        self.errors: dict[str, str] = {}
        self.busy_retries = 0
        self.ended_at: float | None = None  # time.time() when the last process had ended

    def _collect(self, wait_s: float) -> None:
        try:
            part = self._out.get(timeout=wait_s)
        except queue_mod.Empty:
            if time.monotonic() > self._deadline:
                raise RuntimeError("hospitals did not finish within the bound") from None
            if any(p.exitcode not in (0, None) for p in self._procs):
                raise RuntimeError("a hospital worker process died") from None
            return
        self._reported += 1
        self.results.update({k: tuple(v) for k, v in part["results"].items()})
        self.errors.update(part["errors"])
        self.busy_retries += part["busy_retries"]

    def run(self, until=None, tick=None) -> None:
        """Start the processes and :meth:`finish`; ``tick()`` every ``_PROGRESS_S`` (the benchmark's progress)."""
        for p in self._procs:
            p.start()
        self._deadline = time.monotonic() + self._timeout_s
        self.finish(until, tick)

    def finish(self, until=None, tick=None) -> None:
        next_tick = time.monotonic() + self._PROGRESS_S
        while self._reported < len(self._procs):
            self._collect(self._POLL_S if until or tick else 5.0)
            if until is not None and until():
                return
            if tick is not None and time.monotonic() >= next_tick:
                tick()
                next_tick = time.monotonic() + self._PROGRESS_S
        self.stop()

    def raise_errors(self) -> None:
        if self.errors:
            raise RuntimeError(f"{len(self.errors)} hospital failure(s), e.g. {next(iter(self.errors.items()))}")

    def stop(self) -> None:
        for p in self._procs:
            if p.pid is None:
                continue
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
        if self.ended_at is None:
            self.ended_at = time.time()


def _hospital_slice(job: dict, hospitals: list, out) -> None:
    """One worker process: its slice of hospitals as threads, figures back to the parent through ``out``."""
    from secure_afl import pki
    from secure_afl._blas import one_blas_thread
    from secure_afl_tools.harness import behind_the_parties

    behind_the_parties()
    from secure_afl.clients.hospital import HospitalClient

    results, errors, retries = {}, {}, [0]

    def one(i: int, name: str, drop: bool) -> None:
        client = HospitalClient(job["url"], job["session_id"], pki.load_party(job["pki_dir"], "hospital", name),
                                receipts_dir=job["receipts"], timeout=600)
        try:
            if drop and job["backend"] != "secagg":
                return  # never uploads
            kw = {"timeout": job["timeout"]}
            if drop:

                kw["stop_before"] = Stage.MASKED_INPUT
            stats = hospital_stats(job["dim"], job["classes"], job["samples"], job["seed"], i)
            # this thread's own CPU (its crypto, TLS and parsing), whatever the other hospitals on these cores do
            cpu0 = time.thread_time()
            client.submit(stats, **kw)
            if not drop:  # the per-hospital figures are those of hospitals that went to the end
                results[name] = (client.bytes_uploaded, client.conn.bytes_downloaded, time.thread_time() - cpu0)
        except Exception as e:  # reported by the parent
            errors[name] = f"{type(e).__name__}: {e}"
        finally:
            retries[0] += client.conn.busy_retries
            client.close()

    # secagg stages wait for every participant: the whole slice must be in flight together
    width = len(hospitals) if job["backend"] == "secagg" else min(len(hospitals), _UPLOADING_PER_PROCESS)
    # BLAS in the calling hospital's thread: the process already runs hospitals side by side, and BLAS's own
    # second thread, outside every hospital's thread_time, spun 2.3 CPU s per split upload at d = 512 (3.05 s
    # of process CPU against 0.78 s in the hospitals' threads)
    with one_blas_thread(), ThreadPoolExecutor(max_workers=max(1, width)) as pool:
        list(pool.map(lambda h: one(*h), hospitals))
    out.put({"results": results, "errors": errors, "busy_retries": retries[0]})


def _with_gamma(s):

    return SufficientStatistics(s.gram + np.eye(s.dim), s.cross, s.n, s.class_counts, 1.0, 1.0, None)


def format_report(r: dict) -> str:
    lines = [f"bench service: {r['backend']}, K = {r['hospitals']} ({r['dropped']} dropped, "
             f"{r['contributors']} in the release), d = {r['dim']}, C = {r['classes']}, L = {r['length']}, "
             f"{r['samples']} samples per hospital, {r['cpus']} CPUs, server max_connections "
             f"{r.get('max_connections', 64)}" + (f", [split] {r['split']}" if r.get("split") else ""),
             f"{'phase':<10} {'wall s':>9} {'server CPU s':>13} {'server peak RSS MB':>19} "
             f"{'summing workers RSS MB':>23}"]
    for name, p in r["phases"].items():
        cpu = f"{p['server_cpu_s']:.2f}" if "server_cpu_s" in p else "-"
        rss = f"{p['server_peak_rss'] / 1e6:.1f}" if "server_peak_rss" in p else "-"
        if "server_peak_rss" in p and not p.get("peak_is_phase", True):
            rss += " (so far)"
        kids = f"{p['server_children_rss'] / 1e6:.1f}" if p.get("server_children_rss") else "-"
        lines.append(f"{name:<10} {p['wall_s']:>9.2f} {cpu:>13} {rss:>19} {kids:>23}")
    lines.append("(server CPU includes its child processes: the summing workers and the multiprocessing tracker)")
    for st in r["phases"].get("hospitals", {}).get("stages", []):
        lines.append(f"  round {st['round']} {st['stage']:<15} {st['seconds']:>8.1f} s  {st['answered']} of "
                     f"{st['expected']} answered  {st['outcome']}")
    if r.get("hospital_cpu_s"):
        lines.append(f"hospital CPU (its own thread, parameters to receipt): mean {r['hospital_cpu_s']['mean']:.2f} s, "
                     f"max {r['hospital_cpu_s']['max']:.2f} s")
    if "keyholder_share_s" in r["phases"].get("release", {}):
        rel = r["phases"]["release"]
        judged = r["phases"].get("hospitals", {}).get("keyholder_judged_while_open")
        lines.append(f"release: key holder's share (manifest and seed statements fetched and checked, every seed "
                     f"opened, the cohort's masks summed) {rel['keyholder_share_s']:.2f} s, of which judging the "
                     f"uploads not judged while the session was open {rel['server_verifier_s']:.2f} s and the "
                     f"share {rel['judge_and_share_s']:.2f} s"
                     + ("" if judged is None else f"; {judged} uploads judged as they arrived, the others in "
                        f"the judging phase"))
    tl = r["phases"].get("judging", {}).get("timeline")
    if tl:
        lag = tl["lag_s"] or {}
        lines.append(f"uploads arrived {tl['first_arrival_s']:.1f} .. {tl['last_arrival_s']:.1f} s into the hospitals' "
                     f"phase (median {tl['median_arrival_s']:.1f} s; per tenth of that span: "
                     f"{tl['arrivals_per_tenth']}); arrival to verdict: median {lag.get('median', 0):.2f} s, "
                     f"p90 {lag.get('p90', 0):.2f} s, max {lag.get('max', 0):.2f} s; released "
                     f"{tl['released_after_last_upload_s']:.2f} s after the last upload (the benchmark's hospital "
                     f"processes ended {r['phases']['hospitals']['processes_ended_after_release_s']:+.2f} s from "
                     f"the release's end)")
    if r.get("uploads_counted"):
        u = r["uploads_counted"]
        lines.append(f"uploads counted: {u['accepted_records']} accepted upload records from {u['hospitals']} "
                     f"hospitals, {r['contributors']} in the release: "
                     f"{'each survivor exactly once' if u['each_once'] else 'NOT each survivor exactly once'}")
    if "keyholder_resum_s" in r["phases"].get("release", {}):
        lines.append(f"release: key holder's verify + re-sum of the signed uploads "
                     f"{r['phases']['release']['keyholder_resum_s']:.2f} s (before its one decryption)")
    for f, sec in r["phases"].get("release", {}).get("resum_s_by_fetchers", {}).items():
        lines.append(f"  verify + re-sum again over HTTPS, {f} download(s) in flight: {sec:.2f} s")
    lines += [f"bytes up / down per hospital: {r['bytes_up_per_hospital']:,.0f} / "
              f"{r['bytes_down_per_hospital']:,.0f}",
              f"server data dir on disk: {r['server_disk_bytes'] / 1e6:.2f} MB",
              f"429/503 answers absorbed by retrying: hospitals {r['busy_retries']['hospitals']}, "
              f"key holder {r['busy_retries']['keyholder']} (hospitals in {r['hospital_processes']} processes)",
              f"||W - W_plain|| / ||W_plain||: {r['w_rel_error_vs_plain']:.3e}"]
    return "\n".join(lines)


def _run_one(args, backend: str) -> dict:
    import shutil

    workdir = args.workdir or tempfile.mkdtemp(prefix="secure-afl-bench-service-")
    if args.workdir and args.versus:  # one directory per backend: each run has its own PKI, server and keys
        workdir = str(Path(args.workdir) / backend)
    try:
        r = run_service_bench(backend, args.hospitals, dim=args.dim, classes=args.classes,
                              samples=args.samples, dropout=args.dropout, seed=args.seed, workdir=workdir,
                              stage_timeout_s=args.stage_timeout, processes=args.processes,
                              compare_fetchers=args.compare_fetchers, max_connections=args.max_connections,
                              combine_workers=args.combine_workers, split_section=_split_section(args),
                              progress=lambda line: print(f"bench service ({backend}): {line}", file=sys.stderr,
                                                          flush=True))
    finally:
        if not args.workdir:  # the temp dir goes, whatever happened
            shutil.rmtree(workdir, ignore_errors=True)
    print(format_report(r), flush=True)
    return r


def _split_section(args) -> dict:
    """The ``[split]`` keys given on the command line (the session's defaults for the others)."""
    out = {}
    if args.field:
        out["field"] = args.field
    if args.gram_proof:
        out["gram_proof"] = args.gram_proof == "on"
    return out


def format_versus(runs: list[dict]) -> str:
    """Each phase's wall time and server CPU beside the first run's (the same K, d, C on the same machine)."""
    base = runs[0]
    lines = [f"side by side (K = {base['hospitals']}, d = {base['dim']}, C = {base['classes']}; ratio to "
             f"{base['backend']})", f"{'phase':<10} " + " ".join(f"{r['backend'] + ' wall s':>16}" for r in runs)
             + " " + " ".join(f"{r['backend'] + ' / ' + base['backend']:>16}" for r in runs[1:])]
    for name in base["phases"]:
        if not all(name in r["phases"] for r in runs):
            continue
        walls = [r["phases"][name]["wall_s"] for r in runs]
        lines.append(f"{name:<10} " + " ".join(f"{w:>16.2f}" for w in walls) + " "
                     + " ".join(f"{w / walls[0]:>16.2f}" for w in walls[1:]))
    cpu = [r["phases"]["hospitals"].get("server_cpu_s") for r in runs]
    if all(c is not None for c in cpu):
        # split's verifier messages for the last uploads are formed in the judging phase: counted with them
        cpu = [c + r["phases"].get("judging", {}).get("server_cpu_s", 0.0) for r, c in zip(runs, cpu)]
        lines.append("server CPU per upload (hospitals and judging phases): " + ", ".join(
            f"{r['backend']} {1e3 * c / max(1, r['contributors']):.2f} ms" for r, c in zip(runs, cpu)))
    return "\n".join(lines)


def _cmd(args) -> int:
    # the comparison backends first, then --backend: all in this one invocation, on the same machine state
    runs = [_run_one(args, b) for b in [*args.versus, args.backend]]
    if len(runs) > 1:
        print(format_versus(runs))
    if args.json:
        out = runs[-1] if len(runs) == 1 else runs
        Path(args.json).write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    return 0


def register(parser) -> None:
    parser.add_argument("--backend", choices=["plain", "ckks", "bfv", "secagg", "split"], default="plain")
    parser.add_argument("--hospitals", type=int, default=10, help="K hospitals")
    parser.add_argument("--processes", type=int, help="worker processes running the hospitals (default: cores; "
                                                      "secagg: also one per 100 hospitals)")
    parser.add_argument("--dropout", type=float, default=0.0, help="fraction of hospitals that drop out")
    parser.add_argument("--dim", type=int, default=64, help="embedding dimension d (default 64)")
    parser.add_argument("--classes", type=int, default=10, help="classes C (default 10)")
    parser.add_argument("--samples", type=int, default=32, help="samples per hospital")
    parser.add_argument("--stage-timeout", type=float, default=60.0,
                        help="secagg: seconds a silent hospital is waited for in a stage")
    parser.add_argument("--max-connections", type=int,
                        help="the server's connection cap (default: the server's, k_max + 16 and at least 64)")
    parser.add_argument("--combine-workers", type=int, default=0,
                        help="the server's summing processes for ckks/bfv uploads (default 0: automatic)")
    parser.add_argument("--versus", nargs="+", default=[], metavar="BACKEND",
                        choices=["plain", "ckks", "bfv", "secagg", "split"],
                        help="also run these backends first, same K, d and C, and print each phase beside them")
    parser.add_argument("--field", choices=["goldilocks", "field128"],
                        help="split: the session's [split] field (default: the session's default)")
    parser.add_argument("--gram-proof", choices=["on", "off"],
                        help="split: the session's [split] gram_proof (default: the session's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compare-fetchers", action="store_true",
                        help="HE: time the key holder's verify + re-sum again with 1 and N downloads in flight")
    parser.add_argument("--workdir", help="keep PKI, server state and logs here (default: a temp dir, removed)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON here")
    parser.set_defaults(func=_cmd)
