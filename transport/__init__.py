"""The parties' transport: signed mTLS requests to the aggregation server, used by the hospitals and the key
holder alike (network code, so outside the library core; installed as secure_afl.transport)."""
