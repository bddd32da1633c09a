"""Who may act in a session: the signed roster's hospitals, the session's key holder and (for the status view
only) the server's own identity, by name, identity key and TLS certificate."""

from __future__ import annotations

from secure_afl.exceptions import UnknownParty

__all__ = ["SessionRoster"]


class SessionRoster:
    """The enrolments of the roster's hospitals (``enrolled``) and of the key holders (``keyholders``), of
    which only ``keyholder`` acts in this session; ``server``: the server's own enrolment, the identity its
    operator reads the status view as (no route but that one names the ``server`` role)."""

    def __init__(self, session_id: str, keyholder: str, enrolled: dict, keyholders: dict, server=None):
        self.session_id, self.keyholder = session_id, keyholder
        self._enrolled, self._keyholders, self._server = enrolled, keyholders, server

    def lookup_pub(self, party: str):
        return self.enrolment(party).public_key()

    def enrolment(self, party: str):
        role, _, name = party.partition(":")
        if role == "hospital" and name in self._enrolled:  # the signed roster, not every consortium hospital
            return self._enrolled[name]
        if role == "keyholder" and name == self.keyholder and name in self._keyholders:
            return self._keyholders[name]
        if role == "server" and self._server is not None and name == self._server.name:
            return self._server
        raise self.not_in_session(party)

    def not_in_session(self, party: str) -> UnknownParty:
        role, _, name = party.partition(":")
        if role == "hospital":
            # a certificate of this consortium may belong to a spare or withdrawn identity: the signed roster decides
            return UnknownParty(f"{name[:64]!r} is not in the signed roster of session {self.session_id!r}")
        return UnknownParty(f"{party[:80]!r} is not enrolled in this session")

    def peer_party(self, peer: dict) -> str | None:
        fp = peer.get("cert_sha256")
        for role, table in (("hospital", self._enrolled), ("keyholder", self._keyholders)):
            for name, e in table.items():
                if fp is not None and e.cert_sha256 == fp:
                    return f"{role}:{name}"
        return None
