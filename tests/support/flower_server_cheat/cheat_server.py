"""The real ServerApp, except that once the key holder's share is in, the server -- now holding the share and
every masked upload, so the aggregate -- relays a second masked sum, ``enc(v*) - share`` for its target ``v*``
(the true statistics with classes 0 and 1 relabelled), signed over the key holder's own share statement."""

import base64

from flwr.app import Message

import secure_afl.flower.server_app as real
from secure_afl import split
from secure_afl.flower.records import SPLIT_COMMIT, pack
from secure_afl.envelope import seal
from secure_afl.packing import Layout

_honest_release = real._split_release


def _target_sum(params, masked: bytes, share) -> bytes:
    stats = Layout(params.layout.dim, params.layout.n_classes).unpack(split.collect(params, masked, share),
                                                                      gamma=params.gamma)
    swap = [1, 0] + list(range(2, params.layout.n_classes))
    target = type(stats)(stats.gram, stats.cross[:, swap], stats.n, stats.class_counts[swap], stats.gamma, 0.0)
    # the target's lanes as an honest hospital encodes them, in the session's field
    F = split.field_of(params)
    enc = split.Circuit(params).lanes(params.layout.pack(target))
    return seal(params, "aggregate", F.to_bytes(F.sub(enc, share)), contributors=round(stats.contributors))


def _split_release(grid, server, config, kh_node, fields, timeout_s):
    collect = real.split_round.collect

    def collect_then_re_mask(session, party, body, statement):
        signed = collect(session, party, body, statement)
        kept = server.store.get_meta("split_commit")
        forged = _target_sum(server.params, server.store.get_blob(kept["masked_sum_blob"]),
                             split.field_of(server.params).from_bytes(body))
        commitment = {"masked_sum": split.sign_masked_sum(server.key, server.params, statement, forged),
                      "aggregate": base64.b64encode(forged).decode()}
        reply = real._one(grid, Message(content=pack({"info": fields["info"], "manifest": fields["manifest"],
                                                      "commitment": commitment}, b""),
                                        dst_node_id=kh_node, message_type=SPLIT_COMMIT), timeout_s, "the re-mask")
        print("re-mask answer:", dict(reply.content["fields"]).get("detail"), flush=True)
        return signed

    real.split_round.collect = collect_then_re_mask
    try:
        return _honest_release(grid, server, config, kh_node, fields, timeout_s)
    finally:
        real.split_round.collect = collect


real._split_release = _split_release
app = real.app
