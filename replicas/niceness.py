"""The engine's CPU priority: vLLM's engine processes below the serving plane on a shared host.

A replica's engine runs in processes of its own (vLLM's engine core and its workers), children of the
replica. Ray starts every worker at niceness 15, so they inherit the priority of everything else Ray
runs there: the ingress and its request router, the replica's own front (which adds requests to the
engine and streams its tokens), the board and controller actors. On a CPU replica the engine computes
the model on the same cores and keeps them busy; at the same priority a request's routing, its
admission and its tokens wait behind the model's matmuls for a core. Set below them (a higher
niceness), the engine takes whatever CPU the serving plane leaves, and the serving plane gets a core as
soon as it asks (docs/benchmarks/fleet.md, "Measured on this machine").

Linux keeps a niceness per thread, and a thread or process inherits its creator's: so once a process of
the engine is set, what it starts afterwards (compute threads, workers) starts at the same niceness. The
engine is set while it starts, not only once it has: its start (imports, weights, a profiling run, warm-up)
takes seconds of CPU, and at Ray's 15 the engine of a replica starting beside a serving one (a replacement
after a node loss, a scale-up) would run above the engine that serves, at 19. The Ray worker that hosts the
new replica starts at 15 before any of this runs, and keeps it (docs/configuration.md says what that
costs). Raising a niceness needs no privilege; lowering one
below the current value needs ``CAP_SYS_NICE``, so a setting under Ray's 15 is logged and left where
the replica could not change it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

logger = logging.getLogger("ray.serve.ebplus")

#: The niceness a setting may name: from Linux's default, 0, to its lowest priority, 19 (below 0 always needs
#: ``CAP_SYS_NICE``).
NICENESS_RANGE = (0, 19)
#: The engine's niceness on CPU replicas under ``engine_niceness: auto``: the lowest priority there is.
CPU_ENGINE_NICENESS = NICENESS_RANGE[1]
#: How often the engine's processes are set while it starts: a new process runs at Ray's priority until the
#: next sweep, and each sweep reads every process's parent (``/proc``): 1.3 ms of CPU with 82 processes on
#: the 2-core test machine, more on a busier host.
STARTING_SWEEP_S = 0.25

Setting = int | Literal["auto", "inherit"]


def check_setting(value: object, words: tuple[str, ...]) -> object:
    """``value`` if it is one of ``words`` or a niceness in :data:`NICENESS_RANGE`; otherwise one error that
    says what the setting takes (pydantic's own, for a union, would name its internal branches)."""
    low, high = NICENESS_RANGE
    if (isinstance(value, str) and value in words) or (
        isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
    ):
        return value
    choices = ", ".join(repr(w) for w in words)
    raise ValueError(f"must be {choices} or a niceness from {low} to {high}, got {value!r}")


def resolve(setting: Setting, accelerator: str) -> int | None:
    """The niceness to give the engine: a number, or ``None`` to leave it as started."""
    if setting == "inherit":
        return None
    if setting == "auto":
        return CPU_ENGINE_NICENESS if accelerator == "cpu" else None
    return setting


@dataclass(frozen=True)
class Reniced:
    """What :func:`renice_children` did: threads set (of how many processes), and those it could not set."""

    threads: int
    processes: int
    refused: int


def renice_children(niceness: int) -> Reniced:
    """Set every thread of every descendant of this process to ``niceness``.

    A thread that ends while it is being set is skipped; one the kernel refuses (lowering a
    niceness without ``CAP_SYS_NICE``) is counted in ``refused``, not raised, since the engine
    serves at any priority.
    """
    import psutil  # vLLM's and Ray's dependency; imported here so the pure core does not need it

    threads = refused = 0
    children = psutil.Process().children(recursive=True)
    for child in children:
        try:
            tids = [t.id for t in child.threads()]
        except psutil.Error:  # the process ended
            continue
        for tid in tids:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, niceness)
                threads += 1
            except ProcessLookupError:
                continue
            except PermissionError:
                refused += 1
    return Reniced(threads, len(children), refused)


def apply(setting: Setting, accelerator: str) -> Reniced | None:
    """Give this replica's engine processes the niceness ``setting`` resolves to; log what was done."""
    niceness = resolve(setting, accelerator)
    if niceness is None:
        return None
    done = renice_children(niceness)
    if done.refused:
        logger.warning(
            "replicas.engine_niceness: %d of the engine's threads could not be set to niceness %d (a niceness below "
            "the replica's own, %d, needs CAP_SYS_NICE); they keep theirs",
            done.refused,
            niceness,
            os.getpriority(os.PRIO_PROCESS, 0),
        )
    logger.info("engine processes at niceness %d: %d threads in %d processes", niceness, done.threads, done.processes)
    return done


@contextlib.contextmanager
def while_starting(setting: Setting, accelerator: str, every_s: float = STARTING_SWEEP_S) -> Iterator[None]:
    """Set the engine's processes to their niceness while the block starts them, and once more at its end.

    The engine's start blocks the replica's event loop (vLLM builds its client synchronously), so the sweeps
    run on a thread of their own; the final one, after the block, is :func:`apply`'s, which logs.
    """
    niceness = resolve(setting, accelerator)
    if niceness is None:
        yield
        return
    ended = threading.Event()

    def sweep() -> None:
        while not ended.wait(every_s):
            renice_children(niceness)

    sweeper = threading.Thread(target=sweep, name="ebplus-engine-niceness", daemon=True)
    sweeper.start()
    try:
        yield
    finally:
        ended.set()
        sweeper.join()
    apply(setting, accelerator)
