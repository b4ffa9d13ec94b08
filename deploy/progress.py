"""Watching ``ebplus serve`` start: the Serve application's state, a time limit, the logs.

Loading a model takes minutes, and Ray Serve keeps retrying a replica whose engine
fails to start. Without a watch, ``ebplus serve`` prints "deploying" and then nothing
until it works or forever. :func:`wait_until_running` polls the Serve application's
status (``serve.status()``), prints each deployment's replica states with the elapsed
time every ``every_s`` seconds and whenever they change, and gives up after
``timeout_s`` with :class:`DeployError`, whose message names the log directory and
the last error line found in the Serve and worker logs of the Ray session.

Pure logic with injected ``status``/``clock``/``sleep``: the tests drive it with Ray
Serve's own status types and log files written to a temporary directory.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Where Ray keeps the logs of the newest session on this machine (a symlink Ray maintains).
DEFAULT_SESSION_DIR = Path("/tmp/ray/session_latest")

# The last line of a traceback ("ValueError: ...", "ray.exceptions.RayActorError: ..."), and a log
# record at level ERROR/CRITICAL ("ERROR 2025-01-01 12:00:00,000 controller 1 -- message").
_EXCEPTION = re.compile(r"^(?P<type>[\w.]+(?:\([\w.]+\))?): (?P<message>.+)$")
_RECORD = re.compile(r"^(?:ERROR|CRITICAL|FATAL)\b")
# Wrappers that repeat an exception raised elsewhere: Ray's task errors, re-raised tracebacks.
_WRAPPER = re.compile(r"^(Traceback \(most recent call last\)|.*\bray::)")


def _is_exception(line: str) -> bool:
    m = _EXCEPTION.match(line)
    return bool(
        m
        and re.search(r"(Error|Exception|Exit|Interrupt)(\(|$)", m.group("type"))
        and not _WRAPPER.match(m.group("message"))
    )


class DeployError(Exception):
    """The application did not reach RUNNING; the message is one line, the details follow it."""

    def __init__(self, summary: str, details: list[str]) -> None:
        super().__init__(summary)
        self.summary = summary
        self.details = details


@dataclass(frozen=True)
class Snapshot:
    """The application's status in words: ``status`` and one phrase per deployment."""

    status: str
    deployments: tuple[str, ...]
    message: str

    def line(self) -> str:
        parts = "; ".join(self.deployments) or "no deployments yet"
        return f"{self.status}: {parts}"


def _name(value: Any) -> str:
    return str(getattr(value, "value", value))


def snapshot(serve_status: Any, app: str) -> Snapshot:
    """Summarise ``serve.status()`` (a ``ray.serve.schema.ServeStatus``) for one application."""
    overview = serve_status.applications.get(app)
    if overview is None:
        return Snapshot("NOT_STARTED", (), "")
    deployments = []
    for name, dep in sorted(overview.deployments.items()):
        states = ", ".join(f"{count} {_name(state)}" for state, count in sorted(dep.replica_states.items(), key=str))
        deployments.append(f"{name} {_name(dep.status)} ({states or 'no replicas yet'})")
    return Snapshot(_name(overview.status), tuple(deployments), overview.message or "")


def last_error_line(session_dir: Path, since: float = 0.0) -> tuple[Path, str] | None:
    """The newest error in the session's Serve logs and worker stderr files written since ``since``.

    The root cause reads best as the last line of a traceback (a replica constructor's
    ``ValueError: ...``, with its next line when the message continues there, as pydantic's
    do); wrappers that only repeat it (Ray's task errors) are skipped. Without any, the last
    ERROR record. Files are read oldest to newest by modification time, lines in order.
    """
    logs = session_dir / "logs"
    files = [*logs.glob("serve/*.log"), *logs.glob("worker-*.err"), *logs.glob("serve/*.err")]
    exception, record = None, None
    for path in sorted((p for p in files if p.is_file()), key=lambda p: p.stat().st_mtime):
        if path.stat().st_mtime < since:
            continue
        try:
            lines = [line.strip() for line in path.read_text(errors="replace").splitlines()]
        except OSError:
            continue
        for i, text in enumerate(lines):
            if _is_exception(text):
                more = lines[i + 1] if i + 1 < len(lines) else ""
                continued = more and not more.startswith(("File ", "^", "During handling", "The above")) and not (
                    _is_exception(more) or _RECORD.match(more) or re.match(r"^(INFO|WARNING|DEBUG)\b", more)
                )
                exception = (path, f"{text} {more}" if continued else text)
            elif _RECORD.match(text):
                record = (path, text)
    return exception or record


def failure_details(session_dir: Path, since: float, message: str = "") -> list[str]:
    """What to tell the user when the deployment failed: where the logs are and the last error."""
    details = [f"logs: {session_dir / 'logs' / 'serve'} (replicas, controller) and {session_dir / 'logs'}"]
    tail = [ln.strip() for ln in message.splitlines() if ln.strip()]
    if tail:
        details.append(f"Serve says: {tail[-1]}")
    error = last_error_line(session_dir, since)
    if error is not None:
        details.append(f"last error ({error[0].name}): {error[1]}")
    return details


def wait_until_running(
    status: Callable[[], Any],
    app: str,
    timeout_s: float,
    session_dir: Path,
    say: Callable[[str], None],
    every_s: float = 10.0,
    poll_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    wall_clock: Callable[[], float] = time.time,
    cancelled: Callable[[], bool] = lambda: False,
) -> float:
    """Block until ``app`` is RUNNING, or ``cancelled()`` (Ctrl-C); return the seconds it took.

    Args:
        status: ``serve.status`` (returns a ``ServeStatus``).
        timeout_s: give up after this many seconds (0: never).
        session_dir: the Ray session directory, for the log path and the last error.
        say: where progress lines go (one line each).

    Raises:
        DeployError: the application failed (DEPLOY_FAILED) or the time ran out.
    """
    started, started_wall = clock(), wall_clock()
    last_line, last_said = "", -every_s
    while not cancelled():
        snap = snapshot(status(), app)
        elapsed = clock() - started
        if snap.status == "RUNNING":
            return elapsed
        if snap.status == "DEPLOY_FAILED":
            raise DeployError(
                f"the application failed to deploy after {elapsed:.0f} s",
                failure_details(session_dir, started_wall - 1, snap.message),
            )
        line = snap.line()
        if line != last_line or elapsed - last_said >= every_s:
            say(f"{elapsed:5.0f} s  {line}")
            last_line, last_said = line, elapsed
        if timeout_s and elapsed >= timeout_s:
            raise DeployError(
                f"the application is not running after {elapsed:.0f} s ({snap.status}); "
                "raise --deploy-timeout if the model is still loading",
                failure_details(session_dir, started_wall - 1, snap.message),
            )
        sleep(poll_s)
    return clock() - started
