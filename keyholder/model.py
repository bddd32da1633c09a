"""What the model file says about itself.

W alone is a (d, C) matrix: it predicts the right thing only on embeddings from
the session's feature extractor, and its column j means class j of the
session's class order. The file therefore carries, next to W, the session it
came from (id and parameter digest), the class names in column order and the
extractor fingerprint (the session's ``[extractor]`` block and its SHA-256), so
whoever deploys W can check both before using it
(:func:`secure_afl.keyholder.read_model` returns them as metadata).
"""

from __future__ import annotations

from secure_afl.extractor import ExtractorFingerprint
from secure_afl.params import SessionParams

__all__ = ["model_metadata"]


def model_metadata(params: SessionParams, report: dict, lam: float) -> dict:
    """The metadata written with W: session, backend, gamma, lambda, classes, extractor, participants.

    ``class_names`` and ``extractor`` are present when the session declared its extractor
    (``[extractor]`` in session.toml); without one, the columns are only numbered.
    """
    meta = {"session": params.session_id, "params_digest": params.digest().hex(), "backend": params.backend,
            "gamma": params.gamma, "lambda": report.get("lambda_total", lam),
            "classes": params.layout.n_classes, "participants": report["participants"]}
    if params.extractor is not None:
        fp = ExtractorFingerprint.from_dict(params.extractor)
        meta.update(class_names=list(fp.classes), extractor=fp.to_dict(), extractor_sha256=fp.digest())
    return meta
