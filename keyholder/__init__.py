"""The key holder: a party of its own, apart from the server and the hospitals.

``custody`` (keys and keygen record), ``verify`` (signed uploads re-summed
before any decryption), ``flooding`` (noise on every decrypted slot),
``release`` (the finalize pipeline), ``connection`` (its own signed HTTPS),
``cli`` (``secure-afl keyholder``).
"""

from .custody import PASSPHRASE_ENV
from secure_afl.model_file import ModelMetadata
from .release import FinalResult, KeyHolder, read_model, write_model

__all__ = ["KeyHolder", "FinalResult", "ModelMetadata", "write_model", "read_model", "PASSPHRASE_ENV"]
