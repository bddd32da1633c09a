"""``secure-afl client submit``: one hospital's contribution to one session."""

from __future__ import annotations

import json
import logging
from secure_afl import pki
from secure_afl.clients.statsfile import check_readable, load_statistics_file, recorded_extractor
from secure_afl.extractor import ExtractorFingerprint, check_extractor


def _cmd_submit(args) -> int:


    from .hospital import HospitalClient

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="secure-afl: %(message)s")
    party = pki.load_party(args.pki, "hospital", args.name)
    client = HospitalClient(args.server, args.session, party, receipts_dir=args.receipts,
                            secagg_record_dir=args.secagg_record)
    client.conn.retry_s = args.wait_server
    try:
        source = check_readable(args.embeddings or args.stats)  # a wrong path is refused before any connection
        _check_made_for(source, args.name)
        params = client.fetch_params()
        if params.extractor is not None:
            # before anything is computed or sent: the session's sum is meaningless across extractors
            check_extractor(ExtractorFingerprint.from_dict(params.extractor), recorded_extractor(source),
                            source=str(source))
        stats, _ = load_statistics_file(source, n_classes=params.layout.n_classes,
                                        max_norm=params.bounds.max_norm)
        receipt = client.submit(stats, progress=not args.no_progress)
    finally:
        client.close()
    print(json.dumps({"hospital": args.name, "session": args.session, "backend": params.backend,
                      "samples": int(stats.n), "bytes_uploaded": client.bytes_uploaded,
                      "receipt_seq": receipt.get("seq")}))
    return 0


def _check_made_for(source, name: str) -> None:
    """Refuse, before any connection, a file ``client embed --name`` made for another hospital: uploads are
    final, and one under the wrong name would stand for that hospital's data in the sum."""
    from secure_afl.clients.statsfile import read_metadata
    from secure_afl.exceptions import InvalidInputError

    meta = read_metadata(source)
    made_for = meta.get("hospital")
    if made_for and made_for != name:
        origin = f" from {meta['source_path']}" if meta.get("source_path") else ""
        raise InvalidInputError(f"{source} was made for hospital {made_for}{origin}, not for {name}: submit "
                                f"{name}'s own file (nothing was sent)", reason="other_hospital")


def register(parser) -> None:
    parser.add_argument("--server", required=True, help="https://host:port of the aggregation server")
    parser.add_argument("--session", required=True, help="session id")
    parser.add_argument("--pki", required=True, help="PKI directory with ca.pem and this hospital's files")
    parser.add_argument("--name", required=True, help="this hospital's enrolled name")
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--embeddings", help=".npz with X (N x d) and y (N labels in [0, C))")
    src.add_argument("--stats", help="statistics .npz from `client embed --stats-only`")
    parser.add_argument("--receipts", default="receipts", help="directory to keep the signed receipt in")
    parser.add_argument("--secagg-record", default=None, metavar="ABSOLUTE_DIR",
                        help="secagg: directory of this hospital's record of signed survivor sets (default: "
                             "secagg-records in this hospital's own directory of its --pki bundle, where its Flower "
                             "ClientApp keeps it too)")
    parser.add_argument("--no-progress", action="store_true", help="no upload progress bar")
    parser.add_argument("--wait-server", type=float, default=30.0, metavar="SECONDS",
                        help="keep trying to reach a server that is (re)starting this long (default 30)")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.set_defaults(func=_cmd_submit)
