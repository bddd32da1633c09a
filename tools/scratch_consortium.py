"""A throw-away consortium for the attack demonstrations and benchmarks: its PKI and its signed session.

Every tool that plays a whole deployment starts the same way: a CA, the
server and the key holder, one certificate per hospital, then a session
definition the operator signs (written as ``session.toml`` when a real server
process reads it, or only signed when the parties run in process). Written
once here so that the tools cannot drift apart in how they make one.
"""

from __future__ import annotations

from pathlib import Path

from secure_afl import pki
from secure_afl.session.definition import normalise
from secure_afl.session.schema import parse
from secure_afl.session.signed import sign, sign_definition
from secure_afl.server.config import write_config

from .demo import ServerProcess, free_port

SERVER, KEYHOLDER = "aggregator", "keyholder"


def make_pki(pki_dir, hospitals, *, name: str, roster: bool = False):
    """A CA named ``name``, the server ``aggregator``, the key holder ``keyholder`` and each hospital.

    ``roster`` also writes the CA-signed roster (the parties then pin the
    hospitals from it). Returns the server's files and ``{hospital: files}``.
    """
    pki_dir = Path(pki_dir)
    pki.init_ca(pki_dir, name=name)
    server = pki.issue(pki_dir, "server", SERVER)
    pki.issue(pki_dir, "keyholder", KEYHOLDER)
    parties = {h: pki.issue(pki_dir, "hospital", h) for h in hospitals}
    if roster:
        pki.write_roster(pki_dir, pki_dir / pki.ROSTER)
    return server, parties


def server_section(work, pki_dir, port: int | None = None) -> dict:
    """The ``[server]`` section of a server on 127.0.0.1 keeping its data under ``work/server``."""
    return {"host": "127.0.0.1", "port": free_port() if port is None else port, "data_dir": str(Path(work) / "server"),
            "pki_dir": str(pki_dir), "name": SERVER, "keyholder": KEYHOLDER}


def write_session(config, pki_dir, sections: dict) -> Path:
    """Write ``sections`` as the session config at ``config`` and sign it as the operator (what every party pins)."""
    write_config(config, sections)
    sign(config, pki_dir)
    return Path(config)


def sign_session(pki_dir, sections: dict):
    """Sign the definition in ``sections`` (``session`` and ``bounds``) without a config file: parties in process."""
    return sign_definition(normalise(parse(sections)), pki_dir)


def secagg_quorum(hospitals: int) -> int:
    """The largest min_clients a secagg round of ``hospitals`` can still reach (its share threshold allowing)."""
    from secure_afl.secagg import default_threshold, max_min_clients, recommended_neighbours

    k = recommended_neighbours(hospitals)
    thr = default_threshold((hospitals - 1 if k is None else k) + 1)
    return max(1, min(hospitals - thr + 1, max_min_clients(hospitals, thr)))


def start_server(config, log, url: str, party, timeout: float = 120) -> ServerProcess:
    """A ``secure-afl server run`` process for ``config``, ready at ``url`` as ``party`` sees it over mTLS;
    stopped again when it does not come up, so no process is left behind."""
    proc = ServerProcess(config, log).start()
    try:
        proc.wait_ready(url, party.ca_file, (party.cert_file, party.key_file), timeout=timeout)
    except BaseException:
        proc.stop()
        raise
    return proc
