"""The feature extractor a session is bound to.

AFL sums C_k = X_k^T X_k and Q_k = X_k^T Y_k across hospitals; the sum means
something only if every X_k comes from the same map image -> embedding and
every Y_k uses the same class order. The session therefore declares that map
(``[extractor]`` in session.toml), ``client embed`` records the one it ran in
the statistics file, ``client submit`` refuses a file whose extractor differs
(naming both sides), and the declaration is part of the session parameters,
so every signed upload statement (which carries the parameter digest) binds
it.

Fields
------
backbone        torchvision model name ("resnet18")
weights         "sha256:<hex>" of the weights file (a local state dict or the
                torchvision hub checkpoint), or "random-seed:<n>" for a seeded
                random initialisation (tests only)
preset          preprocessing preset ("paper", "imagenet")
input_size      side of the square crop fed to the backbone
classes         class names in label order
dim             embedding dimension d
normalisation   "none", or "l2:<R>" (every embedding scaled to norm R)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Mapping

from .encoding import canonical_text
from secure_afl.exceptions import ExtractorMismatch, InvalidParameterError

__all__ = ["ExtractorFingerprint", "check_extractor", "parse_normalisation"]

_FIELDS = ("backbone", "weights", "preset", "input_size", "classes", "dim", "normalisation")


def parse_normalisation(value: str) -> float | None:
    """``"none"`` -> None; ``"l2:R"`` -> R (> 0)."""
    text = str(value).strip().lower()
    if text == "none":
        return None
    kind, _, radius = text.partition(":")
    try:
        r = float(radius)
    except ValueError:
        r = float("nan")
    if kind != "l2" or not r > 0 or r == float("inf"):
        raise InvalidParameterError(f"normalisation must be 'none' or 'l2:R' with R > 0; got {value!r}")
    return r


@dataclass(frozen=True)
class ExtractorFingerprint:
    backbone: str
    weights: str
    preset: str
    input_size: int
    classes: tuple[str, ...]
    dim: int
    normalisation: str = "none"

    def __post_init__(self):
        if not (self.weights.startswith("sha256:") or self.weights.startswith("random-seed:")):
            raise InvalidParameterError(f"extractor weights must be 'sha256:<hex>' or 'random-seed:<n>'; "
                                        f"got {self.weights!r}")
        parse_normalisation(self.normalisation)
        object.__setattr__(self, "classes", tuple(str(c) for c in self.classes))
        object.__setattr__(self, "input_size", int(self.input_size))
        object.__setattr__(self, "dim", int(self.dim))

    def to_dict(self) -> dict:
        return {"backbone": self.backbone, "weights": self.weights, "preset": self.preset,
                "input_size": self.input_size, "classes": list(self.classes), "dim": self.dim,
                "normalisation": self.normalisation}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ExtractorFingerprint":
        missing = [f for f in _FIELDS if f not in d]
        if missing:
            raise InvalidParameterError(f"extractor declaration lacks {missing}")
        return cls(str(d["backbone"]), str(d["weights"]), str(d["preset"]), int(d["input_size"]),
                   tuple(d["classes"]), int(d["dim"]), str(d["normalisation"]))

    def to_json(self) -> str:
        return canonical_text(self.to_dict())

    def digest(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()


def _show(value) -> str:
    return ",".join(value) if isinstance(value, (list, tuple)) else str(value)


def check_extractor(session: ExtractorFingerprint, recorded: Mapping[str, Any] | None, *, source: str) -> None:
    """Refuse statistics whose recorded extractor is not the session's; the message names both sides."""
    if recorded is None:
        raise ExtractorMismatch(f"{source} records no feature extractor; the session requires "
                                f"{session.backbone} weights {session.weights}: re-run `secure-afl client embed`")
    mine = ExtractorFingerprint.from_dict(recorded)
    diffs = [f"{f}: session {_show(getattr(session, f))} vs file {_show(getattr(mine, f))}"
             for f in _FIELDS if getattr(session, f) != getattr(mine, f)]
    if diffs:
        raise ExtractorMismatch(f"{source} was extracted with another feature extractor ("
                                + "; ".join(diffs) + "); re-extract with the session's")
