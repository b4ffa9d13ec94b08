"""Every wait of the harness has a deadline: :func:`wait_until` and the error it raises."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class HarnessError(RuntimeError):
    """The deployment or a fault did not behave within its deadline."""


def wait_until(what: str, check: Callable[[], Any], timeout_s: float, every_s: float = 0.25) -> Any:
    """Poll ``check`` until it returns something truthy; raise :class:`HarnessError` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last_exc: Exception | None = None
    while True:
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # the thing polled may be restarting
            last_exc = exc
        if time.monotonic() > deadline:
            raise HarnessError(f"timed out after {timeout_s:.0f} s waiting for {what} (last error: {last_exc!r})")
        time.sleep(every_s)
