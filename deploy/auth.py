"""Credentials for /admin (bearer token) and /v1 (optional API key).

Secrets are read from a file or an environment variable named in the config,
never from the config itself, and never logged: :class:`Secret` has no repr of
its value. Comparisons are constant-time.
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, repr=False)
class Secret:
    """A credential; ``None`` value means "not configured"."""

    value: str | None
    source: str  # where it came from, safe to show ("env EBPLUS_ADMIN_TOKEN", "file /run/...")

    def __repr__(self) -> str:
        state = "set" if self.value else "unset"
        return f"Secret({state}, from {self.source})"

    @property
    def configured(self) -> bool:
        return bool(self.value)

    def matches(self, presented: str | None) -> bool:
        """Constant-time comparison; ``False`` when not configured or nothing presented."""
        if not self.value or presented is None:
            return False
        return hmac.compare_digest(self.value.encode(), presented.encode())


def load_secret(env_name: str, file_path: str | None) -> Secret:
    """The file wins over the environment; surrounding whitespace is stripped.

    A configured file must hold a secret: one that cannot be read, or is empty (a Secret
    mounted with the wrong key, a template that rendered nothing), raises ``ValueError``
    instead of leaving the routes it guards open.
    """
    if file_path:
        try:
            text = Path(file_path).read_text().strip()
        except OSError as exc:
            raise ValueError(f"cannot read secret file {file_path}: {exc.strerror}") from None
        if not text:
            raise ValueError(f"secret file {file_path} is empty")
        return Secret(text, f"file {file_path}")
    value = os.environ.get(env_name, "").strip()
    return Secret(value or None, f"env {env_name}")


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, else ``None``."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()
