"""The engine's CPU priority: vLLM's engine processes below the serving plane on a shared host.

A replica's engine runs in processes of its own (vLLM's engine core and its workers), children of the
replica. Ray starts every worker at niceness 15, so they inherit the priority of everything else Ray
runs there: the ingress and its request router, the replica's own front (which adds requests to the
engine and streams its tokens), the board and controller actors. On a CPU replica the engine computes
the model on the same cores and keeps them busy; at the same priority a request's routing, its
admission and its tokens wait behind the model's matmuls for a core. Set below them (a higher
niceness), the engine takes whatever CPU the serving plane leaves, and the serving plane gets a core as
soon as it asks (docs/benchmarks/fleet.md, "Measured on this machine").

Linux keeps a niceness per thread, and a thread or process inherits its creator's: so every thread the
engine processes have when the replica has started is set, and what they start afterwards (compute
threads, workers) starts at the same niceness. Raising a niceness needs no privilege; lowering one
below the current value needs ``CAP_SYS_NICE``, so a setting under Ray's 15 is logged and left where
the replica could not change it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Literal

logger = logging.getLogger("ray.serve.ebplus")

#: The engine's niceness on CPU replicas under ``engine_niceness: auto``: the lowest priority there is.
CPU_ENGINE_NICENESS = 19

Setting = int | Literal["auto", "inherit"]


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
    """Give this replica's engine processes the niceness ``setting`` resolves to; log what was done.

    Called once the engine has started, so its processes and their threads exist.
    """
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
