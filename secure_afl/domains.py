"""Every domain-separation string of the protocol, in one list.

A signature, hash, key derivation or AEAD associated data of one kind must
never verify as another, so each one starts with its own string from here.
Nothing else in the tree spells one out (tests/test_domains.py checks that
every value is distinct, that none is a prefix of another within a group that
shares a key, and that no other module holds such a literal). Changing a
value breaks every stored signature of that kind: bump its version instead.

This module imports nothing: the primitives (secure_afl.hazmat) may use it.
"""

from __future__ import annotations

__all__ = ["SIGNATURES", "HASHES", "SUB_LABELS", "KDF_INFO", "AEAD", "XOF", "MAGICS", "FORMATS", "ALL"]

# -- Ed25519 signatures: PREFIX || message ------------------------------------------------------
REQUEST = b"secure-afl/request/v1\0"                      # a party's signed HTTP request
SECAGG_REQUEST = b"secure-afl/secagg-request/v1\0"        # the server's signed secagg stage request
UPLOAD = b"secure-afl/upload/v1\0"                        # a hospital's upload statement
RECEIPT = b"secure-afl/receipt/v1\0"                      # the server's receipt for an upload
MANIFEST = b"secure-afl/manifest/v1\0"                    # the server's list of summed contributions
SESSION = b"secure-afl/session/v1\0"                      # the operator's session definition
ROSTER = b"secure-afl/roster/v1\0"                        # the CA's roster of enrolled identities
KEYHOLDER_PARAMS = b"secure-afl/keyholder-params/v1\0"    # the key holder over an HE session's parameters
TAG = b"secure-afl/tag/v1\0"                              # a hospital's sealed aggregate tag
AUDIT_RECORD = b"secure-afl/audit-record/v1\0"            # the server over one audit record's hash
AUDIT_CLOSE = b"secure-afl/audit-close/v1\0"              # the server's close record (head of the log)
AUDIT_COUNTERSIGN = b"secure-afl/audit-countersign/v1\0"  # the key holder over that close record
SPLIT_SEED = b"secure-afl/split/seed/v1\0"                # split: a hospital's sealed seed box
SPLIT_SHARE = b"secure-afl/split/share/v1\0"              # split: the share server's answer
SPLIT_VERIFIER = b"secure-afl/split/verifier/v1\0"        # split: the server's verifier message on one upload
SPLIT_SUM = b"secure-afl/split/sum/v1\0"                  # split: the server's masked sum over a share statement's cohort
SECAGG_KEY_ADVERTISEMENT = b"secure-afl/secagg/v2/key-advertisement\0"
SECAGG_CONSISTENCY = b"secure-afl/secagg/v2/consistency-digest\0"
SECAGG_DEAL = b"secure-afl/secagg/v2/deal\0"

# -- hashes: SHA-256(PREFIX || ...) ------------------------------------------------------------
AUDIT_CHAIN = b"secure-afl/audit/v1\0"                    # the audit log's hash chain
SECAGG_GRAPH_SEED = b"secure-afl/secagg/v2/graph-seed\0"  # the neighbour graph's public seed
SECAGG_SHARE_COMMITMENT = b"secure-afl/secagg/v2/share-commitment\0"
SECAGG_DEAL_CHALLENGE = b"secure-afl/secagg/v2/deal-challenge\0"
SPLIT_VALIDITY = b"secure-afl/split/validity/v1\0"        # split: Fiat-Shamir over a committed upload
SPLIT_QUERY = b"secure-afl/split/query/v1\0"              # split: HMAC(key holder's query key, committed upload)
SPLIT_QUERY_RAND = b"secure-afl/split/query-rand/v2\0"    # split: the bit proofs' query points and linear checks
SPLIT_GRAM_QUERY_RAND = b"secure-afl/split/gram-query-rand/v2\0"  # split: the Gram part's query randomness
SPLIT_NOISE_PERM = b"secure-afl/split/noise-permutation/v1\0"  # split DP: the noise words' signed permutation

# -- sub-labels: SHA-256(split Fiat-Shamir seed || LABEL || ...), one per value drawn from the same seed ------
SPLIT_FS_JOINT = b"joint\0"                              # the bit proofs' joint randomness
SPLIT_FS_ROWS = b"rows\0"                                # the projection rows' key
SPLIT_FS_GRAM = b"gram\0"                                # the Gram statement's rho vectors
SPLIT_FS_FACTOR_ROWS = b"factor-rows\0"                  # the Gram factor's projection rows' key
SPLIT_FS_RESIDUAL_ROWS = b"residual-rows\0"              # the Gram residual's projection rows' key (Field128)
SPLIT_FS_NOISE_ROWS = b"noise-rows\0"                    # the DP noise share's projection rows' key (Field128)
SPLIT_FS_SEED = b"seed\0"                                # a hospital's seed digest (under SPLIT_VALIDITY)

# -- HKDF info ---------------------------------------------------------------------------------
SECAGG_PAIRWISE = "secure-afl/secagg/v1/"                 # + purpose/session/lo/hi (hazmat.prg)
TAG_BOX = b"secure-afl/tag-box/v1"                        # the tag's X25519 box
SPLIT_SEED_HPKE = b"secure-afl/split/seed-hpke/v2"        # split: the seed's HPKE box (info || 0 || AD)
SPLIT_QUERY_KEY = b"secure-afl/split/query-key/v1"        # split: the key holder's query key from its seed key
SPLIT_JUDGED_KEY = b"secure-afl/split/judged-sum-key/v1"  # split: the key sealing the judged uploads' mask sum
SPLIT_KEPT_SEED_KEY = b"secure-afl/split/kept-seed-key/v1"  # split: a hospital's key sealing its own seed at rest

# -- AEAD associated data ----------------------------------------------------------------------
SECAGG_SHARE_AD = "secure-afl/secagg/v2/share/"           # + round/digest/sender->recipient/ + commitments
CKKS_SECRET_CONTEXT_AD = b"secure-afl/ckks-secret-context/v1/session="
SPLIT_JUDGED_AD = b"secure-afl/split/judged-sum/v1\0"     # split: + the sealed sum's session and hospitals
SPLIT_KEPT_SEED_AD = b"secure-afl/split/kept-seed/v1\0"    # split: + the kept seed's session, hospital, payload
FLOWER_SECAGG_STATE_AD = "secure-afl flower secagg state"  # label of the sealed secagg state kept between Flower calls

# -- XOF / PRG domains: the 12-byte ChaCha20 nonce of a keystream (hazmat.prg.expand, hazmat.flp.expand_field) --
# A key may be expanded under several of these, so they are all distinct and all exactly 12 bytes.
PRG_SELF_MASK = b"saflSELFmask"                           # secagg: a hospital's self mask PRG(b_u)
PRG_PAIR_MASK = b"saflPAIRmask"                           # secagg: a pairwise mask PRG(s_uv)
PRG_GRAPH = b"saflGRAPHprm"                               # secagg: the neighbour graph's permutation stream
PRG_SPLIT_MASK = b"saflSPLITmsk"                          # reserved: an earlier split mask over Z_2^64
SPLIT_SHARE_XOF = b"saflSPLITfld"                         # split: the whole body's mask stream over F_p
SPLIT_ROW_XOF = b"saflVALIDrow"                           # split validity: the projection rows
SPLIT_PROOF_XOF = b"saflVALIDprf"                         # split validity: the proofs' random seeds
SPLIT_GRAM_ROW_XOF = b"saflVALIDfrw"                      # split validity: the Gram statement's rows
SPLIT_RHO_XOF = b"saflVALIDrho"                           # split validity: the Gram identity's rho vectors
SPLIT_JOINT_XOF = b"saflVALIDjnt"                         # split validity: the joint randomness r
SPLIT_QUERY_XOF = b"saflVALIDqry"                         # split validity: the query points and linear checks
SPLIT_GRAM_QUERY_XOF = b"saflVALIDgqy"                    # split validity: the Gram square-sum queries
SPLIT_NOISE_PERM_XOF = b"saflDPnzperm"                     # split DP: the noise words' signed permutation

# -- byte formats (magic numbers) and file formats ---------------------------------------------
PAYLOAD_MAGIC = b"SAFLPAY1"                               # the payload envelope
CKKS_BODY_MAGIC = b"SAFLCKK1"
BFV_BODY_MAGIC = b"SAFLBFV1"
SECRET_KEY_MAGIC = b"SAFLSK01"
PACKED_STATS_MAGIC = b"AFLSTATS"                          # a packed statistics vector (secure_afl.packing)
EMBEDDINGS_FORMAT = "secure-afl/embeddings/v1"
STATISTICS_FORMAT = "secure-afl/statistics/v1"

# name -> value, by use; the signatures share signing keys, so no one of them may prefix another
SIGNATURES = {
    "REQUEST": REQUEST, "SECAGG_REQUEST": SECAGG_REQUEST, "UPLOAD": UPLOAD, "RECEIPT": RECEIPT,
    "MANIFEST": MANIFEST, "SESSION": SESSION, "ROSTER": ROSTER, "KEYHOLDER_PARAMS": KEYHOLDER_PARAMS,
    "TAG": TAG, "AUDIT_RECORD": AUDIT_RECORD, "AUDIT_CLOSE": AUDIT_CLOSE,
    "AUDIT_COUNTERSIGN": AUDIT_COUNTERSIGN, "SPLIT_SEED": SPLIT_SEED, "SPLIT_SHARE": SPLIT_SHARE,
    "SECAGG_KEY_ADVERTISEMENT": SECAGG_KEY_ADVERTISEMENT, "SECAGG_CONSISTENCY": SECAGG_CONSISTENCY,
    "SECAGG_DEAL": SECAGG_DEAL, "SPLIT_VERIFIER": SPLIT_VERIFIER, "SPLIT_SUM": SPLIT_SUM
}
HASHES = {"AUDIT_CHAIN": AUDIT_CHAIN, "SECAGG_GRAPH_SEED": SECAGG_GRAPH_SEED,
          "SECAGG_SHARE_COMMITMENT": SECAGG_SHARE_COMMITMENT, "SECAGG_DEAL_CHALLENGE": SECAGG_DEAL_CHALLENGE,
          "SPLIT_VALIDITY": SPLIT_VALIDITY, "SPLIT_QUERY": SPLIT_QUERY, "SPLIT_QUERY_RAND": SPLIT_QUERY_RAND,
          "SPLIT_GRAM_QUERY_RAND": SPLIT_GRAM_QUERY_RAND, "SPLIT_NOISE_PERM": SPLIT_NOISE_PERM}
# derived from one Fiat-Shamir seed, so no one of them may prefix another
SUB_LABELS = {"SPLIT_FS_JOINT": SPLIT_FS_JOINT, "SPLIT_FS_ROWS": SPLIT_FS_ROWS, "SPLIT_FS_GRAM": SPLIT_FS_GRAM,
              "SPLIT_FS_FACTOR_ROWS": SPLIT_FS_FACTOR_ROWS, "SPLIT_FS_RESIDUAL_ROWS": SPLIT_FS_RESIDUAL_ROWS,
              "SPLIT_FS_NOISE_ROWS": SPLIT_FS_NOISE_ROWS, "SPLIT_FS_SEED": SPLIT_FS_SEED}
KDF_INFO = {"SECAGG_PAIRWISE": SECAGG_PAIRWISE, "TAG_BOX": TAG_BOX, "SPLIT_SEED_HPKE": SPLIT_SEED_HPKE,
            "SPLIT_QUERY_KEY": SPLIT_QUERY_KEY, "SPLIT_JUDGED_KEY": SPLIT_JUDGED_KEY,
            "SPLIT_KEPT_SEED_KEY": SPLIT_KEPT_SEED_KEY}
AEAD = {"SECAGG_SHARE_AD": SECAGG_SHARE_AD, "CKKS_SECRET_CONTEXT_AD": CKKS_SECRET_CONTEXT_AD,
        "FLOWER_SECAGG_STATE_AD": FLOWER_SECAGG_STATE_AD, "SPLIT_JUDGED_AD": SPLIT_JUDGED_AD,
        "SPLIT_KEPT_SEED_AD": SPLIT_KEPT_SEED_AD}
XOF = {"PRG_SELF_MASK": PRG_SELF_MASK, "PRG_PAIR_MASK": PRG_PAIR_MASK, "PRG_GRAPH": PRG_GRAPH,
       "PRG_SPLIT_MASK": PRG_SPLIT_MASK, "SPLIT_SHARE_XOF": SPLIT_SHARE_XOF, "SPLIT_ROW_XOF": SPLIT_ROW_XOF,
       "SPLIT_PROOF_XOF": SPLIT_PROOF_XOF, "SPLIT_GRAM_ROW_XOF": SPLIT_GRAM_ROW_XOF, "SPLIT_RHO_XOF": SPLIT_RHO_XOF,
       "SPLIT_JOINT_XOF": SPLIT_JOINT_XOF, "SPLIT_QUERY_XOF": SPLIT_QUERY_XOF,
       "SPLIT_GRAM_QUERY_XOF": SPLIT_GRAM_QUERY_XOF, "SPLIT_NOISE_PERM_XOF": SPLIT_NOISE_PERM_XOF}
MAGICS = {"PAYLOAD_MAGIC": PAYLOAD_MAGIC, "CKKS_BODY_MAGIC": CKKS_BODY_MAGIC, "BFV_BODY_MAGIC": BFV_BODY_MAGIC,
          "SECRET_KEY_MAGIC": SECRET_KEY_MAGIC, "PACKED_STATS_MAGIC": PACKED_STATS_MAGIC}
FORMATS = {"EMBEDDINGS_FORMAT": EMBEDDINGS_FORMAT, "STATISTICS_FORMAT": STATISTICS_FORMAT}
# name -> value, every group together
ALL = {**SIGNATURES, **HASHES, **SUB_LABELS, **KDF_INFO, **AEAD, **XOF, **MAGICS, **FORMATS}
