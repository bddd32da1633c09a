"""Key custody: a fresh CKKS key and tag key per session, sealed at rest, and the keygen record.

The keygen record (``<session>.params.json``) is the key holder's own copy of
the session parameters its keys are bound to (CKKS parameters, public-context
hash, tag key, layout, gamma, bounds). The key holder signs exactly these
parameters for the hospitals and, at finalize, decrypts only under them: what
the server reports is compared with the record, never trusted instead of it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from secure_afl import pki
from secure_afl._io import MIN_PASSPHRASE_CHARS, check_passphrase, refuse_if_shared, write_file
from secure_afl.exceptions import InvalidInputError, InvalidKey, ParameterMismatch
from secure_afl.params import SessionParams

from .flooding import check_counts_releasable
from secure_afl.backends import he_module
from secure_afl.tagging import TAG_KEY_PARAM, generate_tag_key

__all__ = ["KeyCustody", "PASSPHRASE_ENV"]

PASSPHRASE_ENV = "SECURE_AFL_KEY_PASSPHRASE"


class KeyCustody:
    """Per-session key files under ``keys_dir`` (0700) for one enrolled key holder."""

    def __init__(self, pki_dir, name: str, keys_dir, *, passphrase: bytes | None = None):
        self.pki_dir = Path(pki_dir)
        self.party = pki.load_party(pki_dir, "keyholder", name)
        self.keys_dir = Path(keys_dir)
        self.keys_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if passphrase is None and os.environ.get(PASSPHRASE_ENV):
            passphrase = os.environ[PASSPHRASE_ENV].encode()
        # checked for strength at keygen only: opening a sealed key with a short one is a wrong passphrase
        # (most often the wrong file), which says so there, not "use a longer one"
        self.passphrase = None if passphrase is None else \
            (passphrase.encode() if isinstance(passphrase, str) else bytes(passphrase))

    def _secret_path(self, session_id: str) -> Path:
        return self.keys_dir / f"{session_id}.secret.enc"

    def public_path(self, session_id: str) -> Path:
        return self.keys_dir / f"{session_id}.public.ctx"

    def params_path(self, session_id: str) -> Path:
        return self.keys_dir / f"{session_id}.params.json"

    def _tag_paths(self, session_id: str) -> tuple[Path, Path]:
        return self.keys_dir / f"{session_id}.tag.enc", self.keys_dir / f"{session_id}.tag.pub"

    def keygen(self, params: SessionParams) -> bytes:
        """Fresh HE (ckks or bfv) and tag keys for this session; writes the keygen record; returns the public
        context."""
        from secure_afl.backends.ckks import save_secret_context

        generate_keys = he_module(params.backend).generate_keys
        bind_public_context = he_module(params.backend).bind_public_context

        if self.passphrase is None:
            raise InvalidInputError(f"a passphrase is needed to store the secret key at rest: --passphrase-file "
                                    f"FILE or ${PASSPHRASE_ENV}")
        check_passphrase(self.passphrase)
        if self._secret_path(params.session_id).exists():
            raise InvalidInputError(f"keys for session {params.session_id} already exist; a session's key is "
                                    "never regenerated (start a new session for a new key)")
        check_counts_releasable(params)  # before any key exists: a session it could never open is refused here
        keys = generate_keys(params)
        public = keys.public_context
        save_secret_context(self._secret_path(params.session_id), keys.secret_context,
                            passphrase=self.passphrase, session_id=params.session_id)
        tag_secret, tag_public = generate_tag_key()
        tag_enc, tag_pub = self._tag_paths(params.session_id)
        save_secret_context(tag_enc, tag_secret, passphrase=self.passphrase, session_id=f"{params.session_id}/tag")
        bound = bind_public_context(params, public).with_backend_params(**{TAG_KEY_PARAM: tag_public})
        write_file(tag_pub, tag_public.encode(), exclusive=True)
        write_file(self.public_path(params.session_id), public, exclusive=True)
        write_file(self.params_path(params.session_id),
                   json.dumps(bound.to_dict(), sort_keys=True).encode(), exclusive=True)
        return public

    def params(self, session_id: str) -> SessionParams:
        """The parameters this key holder generated keys for (its keygen record)."""
        path = self.params_path(session_id)
        if not path.exists():
            raise ParameterMismatch(f"no keygen record for session {session_id} in {self.keys_dir}")
        return SessionParams.from_dict(json.loads(path.read_text()))

    def public_context(self, session_id: str) -> bytes:
        return self.public_path(session_id).read_bytes()

    def tag_public(self, session_id: str) -> str:
        return self._tag_paths(session_id)[1].read_text().strip()

    def secret_context(self, session_id: str) -> bytes:
        """The opened secret key of the session; :class:`InvalidKey` naming the fix if this passphrase is
        missing or is not the one the key was sealed with."""
        from secure_afl.backends.ckks import load_secret_context

        path = self._secret_path(session_id)
        if not path.exists():
            raise InvalidKey(f"no sealed key for session {session_id} in {self.keys_dir}: run `secure-afl "
                             "keyholder keygen` first, or pass the --keys directory it wrote to")
        refuse_if_shared(path, "sealed secret context")
        self._check_passphrase_given(session_id)
        try:
            return load_secret_context(path, passphrase=self.passphrase, session_id=session_id)
        except InvalidKey:
            raise InvalidKey(self._wrong_passphrase(session_id)) from None

    def _check_passphrase_given(self, session_id: str) -> None:
        if self.passphrase is None:
            raise InvalidKey(f"the sealed keys of session {session_id} need the passphrase they were made "
                             f"with: --passphrase-file FILE or ${PASSPHRASE_ENV}")
        if len(self.passphrase.decode("utf-8", "replace")) < MIN_PASSPHRASE_CHARS:
            # keygen never accepts one this short, so it cannot be the right one
            raise InvalidKey(self._wrong_passphrase(session_id) + f" (this one has fewer than "
                             f"{MIN_PASSPHRASE_CHARS} characters: is it the right file?)")

    def _wrong_passphrase(self, session_id: str) -> str:
        return (f"this passphrase does not open the sealed keys of session {session_id} in {self.keys_dir}: "
                "use the one given to `keyholder keygen`; nothing was changed, so the command can be rerun")

    def check_unlock(self, session_id: str) -> None:
        """Refuse now (:class:`InvalidKey`) if this passphrase cannot open the session's sealed keys.

        Called before the public half is published: a mistyped passphrase would otherwise surface
        only at finalize, after every hospital has uploaded under a key nobody can open. The tag key
        is sealed under the same passphrase as the secret context and is the cheaper one to open.
        """
        self._check_passphrase_given(session_id)
        try:
            self.tag_secret(session_id)
        except InvalidKey:
            raise InvalidKey(self._wrong_passphrase(session_id)) from None

    def tag_secret(self, session_id: str) -> bytes:
        from secure_afl.backends.ckks import load_secret_context

        refuse_if_shared(self._tag_paths(session_id)[0], "sealed tag key")
        return load_secret_context(self._tag_paths(session_id)[0], passphrase=self.passphrase,
                                   session_id=f"{session_id}/tag")
