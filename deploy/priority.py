"""The ingress's CPU priority: its process (``http.ingress_niceness``) and its routers' thread (``http.router_niceness``).

Ray Serve decides where each request goes on one thread of the process that calls the deployment (the
ingress): its router loop, where :class:`~ebplus.deploy.request_router.BoardRouter` runs. A decision costs
tens of microseconds of CPU; on a host whose cores the engines keep busy (the CPU test bed) it waited
milliseconds for one at Ray's priority, and starting the whole ingress higher cut the wait but put the
ingress's token streaming above the replicas that feed it (docs/benchmarks/fleet.md). Only the router's
thread needs the core, so only it is raised.

Ray applies ``RAY_worker_niceness`` with ``nice(2)``: an increment over the raylet's niceness (0 on a
default host or pod, so the value is the niceness there), never below it, so it needs no privilege. It does
so on the worker's main thread once the core worker's own C++ threads run, and Linux keeps a niceness per
thread: those threads stay at the raylet's. Raising a thread's niceness needs no privilege, lowering it
does; so the ingress starts at the lower of the two settings, and the router, on its own thread at its
first decision, raises every other thread of the process to the ingress's setting. Threads started later
inherit their creator's niceness: the router's loop keeps its own, the rest start at the ingress's.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from ebplus.replicas.niceness import NICENESS_RANGE

logger = logging.getLogger("ray.serve.ebplus")

#: Ray's per-worker niceness increment, read from the worker's environment (Ray's job manager starts its
#: supervisors at 0 the same way).
RAY_WORKER_NICENESS = "RAY_worker_niceness"
#: Ray's default for ``RAY_worker_niceness``: what ``http.ingress_niceness: inherit`` leaves.
RAY_DEFAULT_WORKER_NICENESS = 15
#: The ingress's environment for its board routers: the two settings, as increments over the raylet's.
ROUTER_NICENESS_ENV = "EBPLUS_ROUTER_NICENESS"
INGRESS_NICENESS_ENV = "EBPLUS_INGRESS_NICENESS"
#: Ray Serve's switch that runs the routers on the caller's own loop instead of a thread of their own.
SEPARATE_ROUTER_LOOP_ENV = "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP"

Setting = int | Literal["inherit"]


def ingress_env(ingress: Setting, router: Setting, board_routers: bool) -> dict[str, str]:
    """The ingress processes' environment for the two settings.

    ``board_routers``: whether any model routes with a board router, the code that raises the other threads
    (Ray's default router is Ray's code); without one, or with ``router: inherit``, only ``ingress`` counts.
    """
    if router == "inherit" or not board_routers:
        return {} if ingress == "inherit" else {RAY_WORKER_NICENESS: str(ingress)}
    rest = RAY_DEFAULT_WORKER_NICENESS if ingress == "inherit" else ingress
    return {
        RAY_WORKER_NICENESS: str(min(rest, router)),
        ROUTER_NICENESS_ENV: str(router),
        INGRESS_NICENESS_ENV: str(rest),
    }


@dataclass(frozen=True)
class RouterThread:
    """What :func:`prioritize_router_thread` did: the router thread's niceness, the threads it raised."""

    native_id: int
    niceness: int
    raised: int


def _niceness(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


def _raise(tid: int, niceness: int) -> bool:
    """Set thread ``tid`` to ``niceness`` if it runs below it (a raise: no privilege); whether it was set."""
    try:
        if _niceness(tid) >= niceness:
            return False
        os.setpriority(os.PRIO_PROCESS, tid, niceness)
    except ProcessLookupError:  # the thread ended
        return False
    return True


#: The process's router thread once set: each model's router calls :func:`prioritize_router_thread`, all on
#: one thread, and a second pass would read the raised thread as the process's start.
_SET: list[RouterThread] = []
_LOCK = threading.Lock()


def prioritize_router_thread(environ: Mapping[str, str] = os.environ) -> RouterThread | None:
    """On the routers' thread: raise the process's other threads to ``http.ingress_niceness`` and this one to
    ``http.router_niceness``, from the niceness the process started at; ``None`` where the ingress's
    environment names no router niceness (``inherit``, or no board router).

    Where Ray Serve runs the routers on the caller's loop (``RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP=0``), this
    thread also streams the responses: it goes to the ingress's niceness with the rest.
    """
    if ROUTER_NICENESS_ENV not in environ or INGRESS_NICENESS_ENV not in environ:
        return None
    with _LOCK:
        if not _SET:
            _SET.append(_prioritize(int(environ[ROUTER_NICENESS_ENV]), int(environ[INGRESS_NICENESS_ENV]), environ))
        return _SET[0]


def _prioritize(router: int, rest: int, environ: Mapping[str, str]) -> RouterThread:
    me = threading.get_native_id()
    top = NICENESS_RANGE[1]
    raylet = _niceness(me) - min(router, rest)  # this thread started at the process's niceness
    if environ.get(SEPARATE_ROUTER_LOOP_ENV, "1") == "0":
        logger.warning("http.router_niceness: the routers share the ingress's loop (%s=0): left at the ingress's "
                       "niceness", SEPARATE_ROUTER_LOOP_ENV)  # fmt: skip
        router = rest
    others = min(top, raylet + rest)
    raised = sum(_raise(int(tid), others) for tid in os.listdir("/proc/self/task") if int(tid) != me)
    _raise(me, min(top, raylet + router))
    niceness = _niceness(me)
    logger.info("request router thread %d at niceness %d; %d other ingress threads raised to %d",
                me, niceness, raised, others)  # fmt: skip
    return RouterThread(me, niceness, raised)
