"""What the model file says about itself.

W alone is a (d, C) matrix: it predicts the right thing only on embeddings from
the session's feature extractor, and its column j means class j of the
session's class order. The file therefore carries, next to W, the session it
came from (id and parameter digest), the class names in column order and the
extractor fingerprint (the session's ``[extractor]`` block and its SHA-256), so
whoever deploys W can check both before using it
(:func:`read_model` returns them as a :class:`ModelMetadata`). The key holder writes it; a hospital, the
auditor and `predict` read it, so it is the library's.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from secure_afl.exceptions import InvalidInputError
from secure_afl.extractor import ExtractorFingerprint
from secure_afl.params import SessionParams

__all__ = ["model_metadata", "ModelMetadata", "write_model", "read_model"]


@dataclass(frozen=True)
class ModelMetadata:
    """What a model file says about its W (d, C).

    ``lam`` is the ridge W was solved with (the key holder's ``--lambda`` plus, ckks, its flooding ridge);
    ``class_names`` (column order) and ``extractor`` are None when the session declared no extractor.
    """

    session: str
    params_digest: str
    backend: str
    gamma: float
    lam: float
    classes: int
    participants: tuple[str, ...]
    class_names: tuple[str, ...] | None = None
    extractor: ExtractorFingerprint | None = None
    extractor_sha256: str | None = None
    samples: int | None = None
    class_counts: tuple[int, ...] | None = None
    w_rel_bound: float | None = None
    share_statement_sha256: str | None = None
    masked_sum_sha256: str | None = None

    @classmethod
    def from_file(cls, raw: dict[str, str], where: str = "the model file") -> "ModelMetadata":
        """From the string metadata of a safetensors file (JSON-encoded values, as :func:`write_model` stores)."""
        try:
            value = {k: v if k in ("session", "params_digest", "backend", "extractor_sha256",
                                   "share_statement_sha256", "masked_sum_sha256") else json.loads(v)
                     for k, v in raw.items()}
            ext = value.get("extractor")
            return cls(session=value["session"], params_digest=value["params_digest"], backend=value["backend"],
                       gamma=float(value["gamma"]), lam=float(value["lambda"]), classes=int(value["classes"]),
                       participants=tuple(value["participants"]),
                       class_names=None if value.get("class_names") is None else tuple(value["class_names"]),
                       extractor=None if ext is None else ExtractorFingerprint.from_dict(ext),
                       extractor_sha256=value.get("extractor_sha256"),
                       samples=None if value.get("samples") is None else int(value["samples"]),
                       class_counts=None if value.get("class_counts") is None else
                       tuple(int(c) for c in value["class_counts"]),
                       w_rel_bound=None if value.get("w_rel_bound") is None else float(value["w_rel_bound"]),
                       share_statement_sha256=value.get("share_statement_sha256"),
                       masked_sum_sha256=value.get("masked_sum_sha256"))
        except (KeyError, TypeError, ValueError) as e:
            raise InvalidInputError(f"{where} is not a secure-afl model file: its metadata lacks or garbles "
                                    f"{e}", reason="invalid_model") from None


def model_metadata(params: SessionParams, report: dict, lam: float) -> dict:
    """The metadata written with W: session, backend, gamma, lambda, classes, extractor, participants.

    ``class_names`` and ``extractor`` are present when the session declared its extractor
    (``[extractor]`` in session.toml); without one, the columns are only numbered.
    """
    meta = {"session": params.session_id, "params_digest": params.digest().hex(), "backend": params.backend,
            "gamma": params.gamma, "lambda": report.get("lambda_total", lam),
            "classes": params.layout.n_classes, "participants": report["participants"]}
    # what a pilot compares its plaintext against (``secure-afl audit compare``): the released counts and the
    # certified bound on W's relative error (None: no bound, C singular)
    # split: the key holder's share statement and the server's committed masked sum the release was formed from,
    # which `secure-afl audit release` matches against the key holder's kept copy and the server's state
    for k in ("samples", "class_counts", "refused", "share_statement_sha256", "masked_sum_sha256"):
        if report.get(k) is not None:
            meta[k] = report[k]
    bound = report.get("w_error_bound") or {}
    if "rel_bound" in bound:
        meta["w_rel_bound"] = bound["rel_bound"] if bound.get("applies") else None
    if params.extractor is not None:
        fp = ExtractorFingerprint.from_dict(params.extractor)
        meta.update(class_names=list(fp.classes), extractor=fp.to_dict(), extractor_sha256=fp.digest())
    return meta


def write_model(path, W: np.ndarray, metadata: dict) -> None:
    """safetensors file: tensor "W" (d, C) float64 plus string metadata; atomic."""
    from safetensors.numpy import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    meta = {k: v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()}
    save_file({"W": np.ascontiguousarray(W, dtype=np.float64)}, str(tmp), metadata=meta)
    os.replace(tmp, path)


def read_model(path) -> tuple[np.ndarray, "ModelMetadata"]:
    """W (d, C) float64 and what the file says about it (:class:`ModelMetadata`)."""
    from safetensors import SafetensorError, safe_open

    if not Path(path).is_file():
        raise InvalidInputError(f"no model file {path}", reason="file_not_found")
    try:
        with safe_open(str(path), framework="numpy") as f:
            W, raw = f.get_tensor("W"), dict(f.metadata() or {})
    except (SafetensorError, OSError, KeyError) as e:
        raise InvalidInputError(f"{path} is not a model file ({e})", reason="invalid_model") from None
    return W, ModelMetadata.from_file(raw, str(path))
