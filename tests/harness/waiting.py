"""Every wait of the harness has a deadline: :func:`wait_until` and the error it raises."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

#: Waits longer than this report their progress.
REPORT_AFTER_S = 30.0


class HarnessError(RuntimeError):
    """The deployment or a fault did not behave within its deadline."""


def wait_until(what: str, check: Callable[[], Any], timeout_s: float, every_s: float = 0.25) -> Any:
    """Poll ``check`` until it returns something truthy; raise :class:`HarnessError` after ``timeout_s``.

    A wait longer than :data:`REPORT_AFTER_S` says so on stdout every :data:`REPORT_AFTER_S`
    and when it ends (a benchmark's progress; in a test, the captured output of a failure
    shows how far it got).
    """
    started = time.monotonic()
    deadline = started + timeout_s
    report_at = started + REPORT_AFTER_S
    last_exc: Exception | None = None
    while True:
        try:
            value = check()
            if value:
                if time.monotonic() - started > REPORT_AFTER_S:
                    print(f"[harness] {what}: after {time.monotonic() - started:.0f} s", flush=True)
                return value
        except Exception as exc:  # the thing polled may be restarting
            last_exc = exc
        now = time.monotonic()
        if now > deadline:
            raise HarnessError(f"timed out after {timeout_s:.0f} s waiting for {what} (last error: {last_exc!r})")
        if now > report_at:
            print(f"[harness] still waiting for {what} ({now - started:.0f} of {timeout_s:.0f} s)", flush=True)
            report_at = now + REPORT_AFTER_S
        time.sleep(every_s)
