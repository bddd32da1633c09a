"""Hospitals and the key holder as a Flower ClientApp; the SuperNode's node config says which.

Hospital node config::

    role="hospital" name="hosp-a" pki-dir="/consortium/pki" data="/ward/stats.npz" receipts-dir="receipts"

``data`` is an embeddings .npz (``X``, ``y``) or a statistics .npz from
``secure-afl client embed --stats-only``. The hospital checks the session
parameters and the server's pinned identity, protects C_k, Q_k and counts with
the session's backend (ckks: under the key holder's public context), signs the
upload with its PKI identity and keeps the server-signed receipt. In a secagg
session it answers each SecAgg stage with its own SecAggClient, whose secrets
stay sealed in ``secagg-dir`` (default ``secagg-state``) between messages; the
record of the survivor sets it signed is kept in its own directory of its PKI
bundle, as ``client submit`` keeps it (``secagg-record``: another, absolute,
directory).

Key holder node config::

    role="keyholder" name="keyholder" pki-dir="/consortium/pki" keys-dir="keys" passphrase-file="pass"
    out="model.safetensors" report="report.json" min-clients=3 min-class-count=5

The key holder signs its context publication (ckks) and, at finalize, first
countersigns the server's audit close record (refusing to decrypt if it does not
describe the manifest's release), then runs the native checks and solve on the
released aggregate; the model and report stay on its machine, only the report
and the countersignature go back to the server.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from cryptography.exceptions import InvalidSignature

from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp import ClientApp

from secure_afl import pki
from secure_afl.session.relay import check_info
from secure_afl.session.signed import load_signed
from secure_afl.params import KEYED_BACKENDS
from secure_afl.clients.hospital import protect_contribution, protect_vector
from secure_afl.clients.statsfile import load_statistics_file
from secure_afl.keyholder_params import PARAMS_SIGNATURE, verify_session_params
from secure_afl.exceptions import (
    InvalidContribution,
    InvalidInputError,
    ParameterMismatch,
    SecureAFLError,
    StageError,
    WrongSession,
)
from secure_afl.params import SessionParams
from secure_afl.protocol import API, SECAGG_CONSISTENCY, SECAGG_REQUEST_PREFIX, sign_request
from secure_afl.secagg import SecAggClient, Stage, decode_message
from secure_afl.signing import sign_upload, verify_receipt

from . import keyholder_adapter
from .records import pack, unpack_blob, unpack_json, unpack_str
from .secagg_state import SealedState, export_client, restore_client
from secure_afl.secagg.record import SurvivorRecord, default_directory

__all__ = ["app"]

app = ClientApp()


def _cfg(context: Context, key: str, role: str):
    try:
        return context.node_config[key]
    except KeyError:
        raise InvalidInputError(f"this SuperNode's --node-config lacks {key}=... (needed by the {role})") from None


def _role(context: Context, expected: str) -> None:
    if _cfg(context, "role", expected) != expected:
        raise StageError(f"this SuperNode serves a {context.node_config['role']}, not a {expected}")


def _party(context: Context, role: str):
    return pki.load_party(_cfg(context, "pki-dir", role), role, str(_cfg(context, "name", role)))


@app.query("roll_call")
def roll_call(msg: Message, context: Context) -> Message:
    role = str(_cfg(context, "role", "SuperNode"))
    if role not in ("hospital", "keyholder"):
        raise InvalidInputError(f"role must be hospital or keyholder, not {role!r}")
    return Message(content=pack({"role": role, "name": str(_cfg(context, "name", role))}), reply_to=msg)


# -- hospital ------------------------------------------------------------------------------------
def _definition(info: dict, party, context: Context):
    """The operator-signed definition of the session the ServerApp names, from this hospital's own bundle.

    A SuperNode may pin one session (``session=...`` in its node config); then no other is served.
    """
    sid = info.get("session_id")
    pinned = context.node_config.get("session")
    if pinned is not None and sid != str(pinned):
        raise WrongSession(f"this SuperNode serves session {pinned!r}, not {sid!r}")
    if not isinstance(sid, str):
        raise WrongSession("the ServerApp names no session")
    return load_signed(party.pki_dir, sid)


def _session_params(info: dict, party, context: Context) -> SessionParams:
    """The same checks as the native client's fetch_params: open session, the signed definition, pinned server."""
    if info.get("status") != "open":
        raise StageError(f"session {info.get('session_id')} is {info.get('status')}, not open")
    params = check_info(_definition(info, party, context), info, source="the ServerApp")
    if info["server_identity_pub"] != pki.public_key_hex(pki.pinned_identity(party.pki_dir, "server")):
        raise ParameterMismatch("the server does not present the pinned identity key")
    if params.backend in KEYED_BACKENDS:
        # the server relays the key holder's keys; only the key holder's own signature makes them its keys
        verify_session_params(params, info.get(PARAMS_SIGNATURE), pki.pinned_identity(party.pki_dir, "keyholder"))
    return params


@app.train("upload")
def upload(msg: Message, context: Context) -> Message:
    _role(context, "hospital")
    party = _party(context, "hospital")
    params = _session_params(unpack_json(msg.content, "info"), party, context)
    stats, _ = load_statistics_file(_cfg(context, "data", "hospital"), n_classes=params.layout.n_classes,
                                    max_norm=params.bounds.max_norm)
    ctx = unpack_blob(msg.content) if params.backend in KEYED_BACKENDS else None
    payload, tag = protect_contribution(party, params, stats, public_context=ctx)
    sha = hashlib.sha256(payload)
    statement = sign_upload(party.identity_key(), params.session_id, params.digest(), sha.digest(), party.name)
    # Flower keeps a node's context between the messages of one run: the receipt must name this payload
    context.state["secure-afl"] = ConfigRecord({"payload_sha256": sha.hexdigest()})
    return Message(content=pack({"hospital": party.name, "statement": statement, "tag": tag}, payload),
                   reply_to=msg)


@app.query("receipt")
def receipt(msg: Message, context: Context) -> Message:
    """Verify the server-signed receipt against the pinned key and keep it for the auditor."""
    _role(context, "hospital")
    party = _party(context, "hospital")
    if "error" in msg.content["fields"]:
        raise StageError(f"upload refused: {unpack_str(msg.content, 'error')}: {unpack_str(msg.content, 'detail')}")
    rc = verify_receipt(unpack_json(msg.content, "receipt"), pki.pinned_identity(party.pki_dir, "server"))
    uploaded = context.state["secure-afl"]["payload_sha256"] if "secure-afl" in context.state else None
    if rc["hospital"] != party.name or rc["payload_sha256"] != uploaded:
        raise ParameterMismatch("receipt does not acknowledge this hospital's payload")
    out = Path(str(context.node_config.get("receipts-dir", "receipts")))
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"receipt-{rc['session_id']}-{party.name}.json"
    path.write_text(json.dumps(rc, indent=2, sort_keys=True))
    return Message(content=pack({"payload_sha256": rc["payload_sha256"]}), reply_to=msg)


# -- hospital, secagg ------------------------------------------------------------------------------
_SECAGG = "secure-afl-secagg"


def _peer_keys(definition, party) -> dict:
    """Identity keys by client id: the signed roster's numbering, the keys the CA-signed roster enrols."""
    peers = pki.load_enrolments(party.pki_dir, role="hospital")
    ids = definition.client_ids
    missing = sorted(set(ids) - set(peers))
    if missing or party.name not in ids:
        raise InvalidContribution(f"the signed session does not seat {party.name} among enrolled hospitals")
    return {ids[n]: peers[n].public_key() for n in ids}


def _new_secagg_client(info: dict, party, context: Context, record: SurvivorRecord) -> SecAggClient:
    """The native participant's checks (signed definition, pinned server, the signed roster's numbering), the
    round number, and its rule: a hospital that signed a survivor set of this session joins no later setup."""
    params = _session_params(info, party, context)
    if params.backend != "secagg":
        raise ParameterMismatch(f"the session runs {params.backend}, not secagg")
    r = (info.get("secagg") or {}).get("round", 1)
    record.refuse_if_signed(r)  # any round, this one included: a re-run after a restart is refused too
    definition = _definition(info, party, context)
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise InvalidContribution(f"the ServerApp announced round {r!r}")
    return SecAggClient(params, definition.client_ids[party.name], party.identity_key(),
                        _peer_keys(definition, party), round=r)


@app.query("secagg")
def secagg(msg: Message, context: Context) -> Message:
    """One SecAgg stage: the server-signed request goes to this hospital's own SecAggClient.

    Every check against a malicious server is the state machine's (as in the
    native client); this handler adds the transport's: the request carries the
    pinned server's signature, and the answer is signed by this hospital (a
    request signature for stage messages, an upload statement for the masked
    input) because a Flower node id proves nothing. The client's secrets stay
    at this hospital between messages (:mod:`secure_afl.flower.secagg_state`).
    """
    _role(context, "hospital")
    party = _party(context, "hospital")
    phase = unpack_str(msg.content, "stage")
    sid = unpack_str(msg.content, "session_id")
    secagg_dir = context.node_config.get("secagg-dir", "secagg-state")
    sealed = SealedState(secagg_dir, sid, party.name, context.run_id)
    # the record of signed survivor sets: in this hospital's PKI bundle, as for `client submit` (an explicit
    # secagg-record must be absolute)
    explicit = context.node_config.get("secagg-record")
    record = SurvivorRecord(default_directory(party) if explicit is None else Path(str(explicit)), sid, party.name)
    if phase == Stage.SETUP:
        info = unpack_json(msg.content, "info")
        if info.get("session_id") != sid:
            raise WrongSession(f"the setup names session {sid!r} and carries the info of {info.get('session_id')!r}")
        client = _new_secagg_client(info, party, context, record)
        key = SealedState.new_key()
        context.state[_SECAGG] = ConfigRecord({"key": key})
    else:
        if _SECAGG not in context.state:
            raise StageError("no SecAgg setup in this run: refusing a later stage")
        key = context.state[_SECAGG]["key"]
        client = restore_client(sealed.load(key), party.identity_key(),
                                _peer_keys(load_signed(party.pki_dir, sid), party))
    try:
        fields, body = _secagg_answer(client, party, phase, msg, context, record)
    finally:  # an aborted client is kept aborted: it answers nothing more in this run
        sealed.save(key, export_client(client))
    if client.stage in ("done", "aborted"):
        sealed.erase()
    return Message(content=pack({"hospital": party.name, "stage": phase, **fields}, body), reply_to=msg)


def _secagg_answer(client: SecAggClient, party, phase: str, msg: Message, context: Context,
                   record: SurvivorRecord):
    params = client.params
    sid = params.session_id
    if phase == SECAGG_CONSISTENCY:
        # one process of this hospital at a time from the check until the signature is in the reply
        with record.signing():
            record.refuse_if_signed(client.round)  # one survivor set per session, whichever process signed it
            body = client.sign_survivors(unpack_json(msg.content, "survivors")).to_bytes()
            record.write(client.round)  # before the signature can reach the ServerApp
    else:
        raw = unpack_blob(msg.content)
        try:
            pki.pinned_identity(party.pki_dir, "server").verify(bytes.fromhex(unpack_str(msg.content, "signature")),
                                                      SECAGG_REQUEST_PREFIX + raw)
        except (InvalidSignature, ValueError):
            raise InvalidContribution("a secagg request does not carry the server's signature") from None
        request = decode_message(raw)
        if phase == Stage.MASKED_INPUT:
            stats, _ = load_statistics_file(_cfg(context, "data", "hospital"), n_classes=params.layout.n_classes,
                                            max_norm=params.bounds.max_norm)
            payload = client.handle(request, vector=protect_vector(params, stats)).to_bytes()
            sha = hashlib.sha256(payload)
            statement = sign_upload(party.identity_key(), sid, params.digest(), sha.digest(), party.name)
            context.state["secure-afl"] = ConfigRecord({"payload_sha256": sha.hexdigest()})
            return {"statement": statement}, payload
        body = client.handle(request).to_bytes()
    path = f"{API}/sessions/{sid}/secagg/{phase}"
    return {"headers": sign_request(party.identity_key(), f"hospital:{party.name}", "POST", path, body)}, body


# -- key holder ----------------------------------------------------------------------------------
@app.query("publish")
def publish(msg: Message, context: Context) -> Message:
    _role(context, "keyholder")
    kh = keyholder_adapter.open_keyholder(context.node_config)
    sid = unpack_str(msg.content, "session_id")
    path = unpack_str(msg.content, "path")
    if path != f"{API}/sessions/{sid}/context":
        raise ParameterMismatch(f"refusing to sign a publication for {path!r}")
    body = keyholder_adapter.publication(kh, sid)
    headers = sign_request(kh.party.identity_key(), f"keyholder:{kh.party.name}", "POST", path, body)
    return Message(content=pack({"headers": headers}, body), reply_to=msg)


@app.query("countersign")
def countersign(msg: Message, context: Context) -> Message:
    """The countersignature the ServerApp stores before it asks for the release (or the refusal)."""
    _role(context, "keyholder")
    kh = keyholder_adapter.open_keyholder(context.node_config)
    try:
        cs = keyholder_adapter.countersign(kh, unpack_json(msg.content, "close"), unpack_json(msg.content, "manifest"))
    except SecureAFLError as e:
        return Message(content=pack({"error": e.reason, "detail": str(e)}), reply_to=msg)
    return Message(content=pack({"countersign": cs}), reply_to=msg)


@app.query("finalize")
def finalize(msg: Message, context: Context) -> Message:
    _role(context, "keyholder")
    nc = context.node_config
    kh = keyholder_adapter.open_keyholder(nc)
    info, blob = unpack_json(msg.content, "info"), unpack_blob(msg.content)
    tags, contributions = {}, {}
    if "contributions" in msg.content["fields"]:  # HE: the signed uploads, concatenated in manifest order
        tags, at = unpack_json(msg.content, "tags"), 0
        for hospital, n in unpack_json(msg.content, "contributions"):
            contributions[str(hospital)], at = blob[at:at + int(n)], at + int(n)
    manifest = unpack_json(msg.content, "manifest")
    unmask = unpack_json(msg.content, "unmask") if "unmask" in msg.content["fields"] else None
    # before anything is decrypted: countersign the server's close record, or refuse (DecryptionRefused)
    countersign = keyholder_adapter.countersign(kh, unpack_json(msg.content, "close"), manifest)
    if "split" in msg.content["fields"]:
        return _split_share(kh, info, manifest, msg, context, countersign)
    try:
        report = keyholder_adapter.finalize(
            kh, info, blob, manifest, tags, contributions, unmask=unmask,
            min_clients=int(_cfg(context, "min-clients", "keyholder")),
            min_class_count=int(nc.get("min-class-count", 1)), lam=float(nc.get("lambda", 0.0)),
            out=Path(str(_cfg(context, "out", "keyholder"))),
            report_path=Path(str(nc.get("report", "report.json"))))
    except SecureAFLError as e:  # the countersignature still goes back: the auditor keeps the head either way
        return Message(content=pack({"countersign": countersign, "error": e.reason, "detail": str(e)}),
                       reply_to=msg)
    return Message(content=pack({"report": report, "countersign": countersign}), reply_to=msg)


def _split_share(kh, info: dict, manifest: dict, msg: Message, context: Context, countersign: dict) -> Message:
    """split: this key holder's share statement over the manifest's cohort (from the seed statements only), or
    why not."""
    nc = context.node_config
    try:
        verifier = unpack_json(msg.content, "verifier") if "verifier" in msg.content["fields"] else None
        statement = keyholder_adapter.split_share(
            kh, info, manifest, unpack_json(msg.content, "tags"), verifier,
            min_clients=int(_cfg(context, "min-clients", "keyholder")))
    except SecureAFLError as e:
        return Message(content=pack({"countersign": countersign, "error": e.reason, "detail": str(e)}), reply_to=msg)
    # the share stays here (kept by the adapter) until the server has committed to its masked sum
    return Message(content=pack({"countersign": countersign, "share_statement": statement}, b""), reply_to=msg)


@app.query("split_queries")
def split_queries(msg: Message, context: Context) -> Message:
    """split: this key holder's query seed for each upload whose signed seed statement holds (from its own
    query key and the upload's commitment): the server forms its verifier messages at them."""
    _role(context, "keyholder")
    kh = keyholder_adapter.open_keyholder(context.node_config)
    try:
        queries = keyholder_adapter.split_queries(kh, unpack_json(msg.content, "info"),
                                                  unpack_json(msg.content, "tags"))
    except SecureAFLError as e:
        return Message(content=pack({"error": e.reason, "detail": str(e)}), reply_to=msg)
    return Message(content=pack({"queries": queries}), reply_to=msg)


@app.query("split_commit")
def split_commit(msg: Message, context: Context) -> Message:
    """split: the server's committed masked sum over this key holder's own share statement, checked and kept;
    only then its share, as the answer."""
    _role(context, "keyholder")
    kh = keyholder_adapter.open_keyholder(context.node_config)
    try:
        share = keyholder_adapter.split_commit(kh, unpack_json(msg.content, "info"),
                                               unpack_json(msg.content, "manifest"),
                                               unpack_json(msg.content, "commitment"))
    except SecureAFLError as e:
        return Message(content=pack({"error": e.reason, "detail": str(e)}), reply_to=msg)
    return Message(content=pack({}, share), reply_to=msg)


@app.query("split_result")
def split_result(msg: Message, context: Context) -> Message:
    """split: the release this key holder forms from the masked sum it kept before its share left, and its
    share (W, the report), written as ``keyholder finalize`` writes it, with its own privacy record."""
    _role(context, "keyholder")
    nc = context.node_config
    kh = keyholder_adapter.open_keyholder(nc)
    try:
        report = keyholder_adapter.split_result(
            kh, unpack_json(msg.content, "info"),
            lam=float(nc.get("lambda", 0.0)), min_class_count=int(nc.get("min-class-count", 1)),
            out=Path(str(_cfg(context, "out", "keyholder"))), report_path=Path(str(nc.get("report", "report.json"))))
    except SecureAFLError as e:
        return Message(content=pack({"error": e.reason, "detail": str(e)}), reply_to=msg)
    return Message(content=pack({"report": report}), reply_to=msg)
