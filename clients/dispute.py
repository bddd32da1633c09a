"""``secure-afl client dispute``: a split hospital whose upload the key holder refused learns, in one line, who
is at fault -- the server, the key holder or itself -- from what it kept beside its receipt (its upload, its
signed seed statement, its sealed mask seed) and the two verifier messages the key holder published with its
refusal (``<session>.validity-refusals.json``) (:func:`secure_afl.split.roles.dispute`).

The mask seed is opened only once the server's signed message is found true: a server-fault verdict needs the
upload alone. What showing each verdict to someone else discloses is in docs/VALIDITY.md ("Disputes").

Runs on: the hospital.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from secure_afl import pki
from secure_afl.encoding import parse_json
from secure_afl.exceptions import InvalidInputError

__all__ = ["register", "dispute_line"]


def dispute_line(hospital: str, out: dict) -> str:
    """The one line the command prints for :func:`secure_afl.split.roles.dispute`'s answer ``out``."""
    if out["at_fault"] == "server":
        return (f"AT FAULT: the server -- its signed verifier message for {hospital} is not the one {hospital}'s "
                "upload gives; anyone given the upload can check it (the mask seed was not opened)")
    if out["at_fault"] == "keyholder":
        why = ("its published verifier message is not the one the upload and seed give"
               if out["keyholder_message_true"] is False else "the two published messages accept the upload")
        return (f"AT FAULT: the key holder -- it refused {hospital} although {why}; proving it to a third party "
                f"shows them {hospital}'s upload and seed, which decode to its statistics")
    return (f"AT FAULT: this hospital ({hospital}) -- both published messages are true and its upload fails the "
            f"{out['verdict']} check")


def _released_params(client):
    """The session's parameters as the server states them after the release, checked as at upload: against the
    signed definition, the pinned server identity and the key holder's signature over its keys."""
    from secure_afl.exceptions import ParameterMismatch
    from secure_afl.keyholder_params import PARAMS_SIGNATURE, verify_session_params
    from secure_afl.session.relay import check_info

    info = client.conn.info()
    params = check_info(client.definition, info)
    if info["server_identity_pub"] != pki.public_key_hex(client.server_pub):
        raise ParameterMismatch("the server does not present the pinned identity key")
    verify_session_params(params, info.get(PARAMS_SIGNATURE),
                          pki.pinned_identity(client.party.pki_dir, "keyholder", client.keyholder_name))
    return params


def _cmd_dispute(args) -> int:
    from secure_afl import split
    from secure_afl.audit_verify import load_receipts

    from .hospital import HospitalClient

    party = pki.load_party(args.pki, "hospital", args.name)
    client = HospitalClient(args.server, args.session, party, receipts_dir=args.receipts)
    try:
        params = _released_params(client)
    finally:
        client.close()
    if params.backend != "split":
        raise InvalidInputError(f"session {args.session} runs {params.backend}: a dispute is over a split refusal")
    payload_path, statement_path, _ = client.dispute_paths()
    try:
        payload, statement = payload_path.read_bytes(), json.loads(statement_path.read_text())
    except (OSError, ValueError):
        raise InvalidInputError(f"no kept upload of {args.name} for session {args.session} in {args.receipts} "
                                f"({payload_path.name}, {statement_path.name})", reason="file_not_found") from None
    sha = hashlib.sha256(payload).hexdigest()
    if not any(r.get("session_id") == args.session and r.get("hospital") == args.name and
               r.get("payload_sha256") == sha for r in load_receipts(args.receipts)):
        raise InvalidInputError(f"no receipt of session {args.session} in {args.receipts} acknowledges the kept "
                                "upload: the dispute is over what the server acknowledged")
    evidence = parse_json(Path(args.evidence).read_bytes(), f"the key holder's refusal evidence {args.evidence}")
    try:
        server_message = evidence["server_messages"][args.name]
        keyholder_message = evidence["keyholder"][args.name]["keyholder_message"]
    except (KeyError, TypeError):
        raise InvalidInputError(f"{args.evidence} records no refusal of {args.name}") from None
    out = split.dispute(params, args.name, payload, statement, client.kept_seed, server_message, keyholder_message,
                        pki.pinned_identity(args.pki, "server"))
    print(dispute_line(args.name, out))
    return 0


def register(parser) -> None:
    parser.add_argument("--server", required=True, help="https://host:port of the aggregation server (the session's "
                                                        "parameters, checked against the signed session)")
    parser.add_argument("--session", required=True, help="session id")
    parser.add_argument("--pki", required=True, help="PKI directory with ca.pem and this hospital's files")
    parser.add_argument("--name", required=True, help="this hospital's enrolled name")
    parser.add_argument("--receipts", default="receipts",
                        help="the directory `client submit --receipts` wrote (the receipt, the kept upload and seed)")
    parser.add_argument("--evidence", required=True,
                        help="the key holder's published refusal evidence (<session>.validity-refusals.json)")
    parser.set_defaults(func=_cmd_dispute)
