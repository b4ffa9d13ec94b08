"""The controller actor's worker thread: a fleet's re-plans and snapshots off the event loop that answers telemetry.

The event loop of :class:`~ebplus.controller.actor.ControllerActor` answers every replica's
push. At 256 replicas a re-plan (:meth:`FleetController.recompute
<ebplus.controller.fleet.FleetController.recompute>`) is 80-200 ms of work, and the snapshot
persisted before its new version is published is a megabyte of JSON; a push that waited for
either would wait that long. :class:`FleetWorker` runs them in a thread of its own, one at a
time, while the loop goes on answering:

* **Ownership, not locks.** While a round of work runs, the worker thread alone touches the
  fleet. A push that arrives meanwhile is decoded and validated on the loop, answered with
  the thresholds published when the round started, and its telemetry *held*; the next round
  absorbs what was held, in arrival order, before anything else. So a re-plan works on the
  state as it was when the round started (nothing else writes it), no record is lost, and
  the maths runs as plain, single-threaded functions: the in-process controller that the
  simulator and the tests drive is the same code, run synchronously.
* **Persisted, then published at once.** A round that moves the version persists the state
  (the models' own serialisation) before the loop hears of it; the loop then drops the
  answers it held in one assignment, and every reply after carries the new thresholds.
* **One round at a time, coalesced.** A re-plan falling due while a round runs is made by
  the next round, which absorbs everything held first; updates due meanwhile are one.
* **Backpressure.** At most :data:`MAX_HELD` batches are held; a push beyond waits for
  the next round to take them.

Why a thread. The work is numpy and pure Python on state the loop's own pushes update. A
process fed a snapshot would need, for every re-plan, the fleet copied out (pickled, ~100 MB at
256 replicas, taking several times the re-plan itself with the interpreter lock held: the
benchmark's snapshot figure) and the plans and planner states copied back; a fork, the copy-on-write
snapshot, holds the lock for milliseconds at each re-plan (about an idle push's p99). A planner actor
owning the fleet would take the whole telemetry stream as well (a second ingestion), and
every admin call would be a round trip to it. A fleet in a process of its own, fed every push by
a thin front, was prototyped: on the 2-core benchmark machine its pushes waited no less, relative
to idle ones, since a CPU kept busy by any process there costs a waiting push most of what this
thread does. The thread needs no copy and no protocol, and the maths stays ordinary functions.
What it costs is sharing one process with the loop, in two ways, each bounded here:

* **The CPU.** On a machine with few cores, busy with other work, the loop's thread and the
  worker's share one core, and the kernel lets a running thread go on for its slice (a few
  milliseconds) before a woken one runs: a push waited that long. The worker thread runs at
  a lower priority (:data:`WORKER_NICE`), so the loop's thread takes the CPU when a push
  wakes it. Not the lowest: a worker starved by other processes while it holds the
  interpreter lock holds up the loop as well.
* **The interpreter lock.** The loop releases it at every turn (waiting for I/O) and must
  then wait for the worker to hand it back: after the switch interval, 5 ms by default,
  which the worker shortens to :data:`SWITCH_INTERVAL_S` while a round runs. The switch
  happens between Python bytecodes; pydantic's serialisation of the state (~15 ms at 256
  replicas) runs some often enough (a thread waiting on the lock while another serialised
  it got it within 1 ms at p99).

``docs/benchmarks/controller.md`` measures what a push waits, and what each of these is worth; its controls
(a round as long that holds no lock; one spent busy in another process) measure what a re-plan elsewhere
could gain at most, and what it gains on a machine it shares with the actor.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import sys
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar

from ebplus.controller.messages import TelemetryBatch, ThresholdUpdate

if TYPE_CHECKING:
    from ebplus.controller.fleet import FleetController

T = TypeVar("T")

#: Telemetry batches held while a round runs; a push beyond them waits for the next round.
MAX_HELD = 1024
#: The worker thread's nice value (Linux). Lower priority lets the event loop's thread, woken by a push, take the
#: CPU from the worker; too low starves the worker on a machine busy with other work *while it holds the
#: interpreter lock*, which the loop then waits for. 5 (a third of a default thread's weight) is between the two.
WORKER_NICE = 5
#: The interpreter's switch interval while a round runs (seconds): how long the event loop's thread waits for the
#: interpreter lock the worker holds, at each turn of the loop.
SWITCH_INTERVAL_S = 0.000025

logger = logging.getLogger("ebplus.controller")


class FleetWorker:
    """Runs the fleet's long work in a thread of its own (see the module docstring).

    Args:
        fleet: the fleet's owner's accessor (the actor may replace its fleet).
        persist: called in the worker thread after a change, with ``force``: persists the state
            if the version moved since the last one persisted (or if forced).
    """

    def __init__(self, fleet: Callable[[], FleetController], persist: Callable[[bool], None]) -> None:
        self._fleet = fleet
        self._persist = persist
        self._executor = ThreadPoolExecutor(1, "ebplus-controller-worker", initializer=_yield_the_cpu)
        #: a round, or a change of the fleet on the loop that must not overlap one (registration)
        self.lock = asyncio.Lock()
        self._answers: dict[str, ThresholdUpdate] | None = None  # what was published when the running round started
        self._held: deque[TelemetryBatch] = deque()
        self._cause: str | None = None  # a re-plan asked for and not started yet
        self._next: asyncio.Future | None = None  # the round that takes what is held and asked for now
        self._rounds: asyncio.Task | None = None
        self._space = asyncio.Event()
        #: counts of pushes that arrived while a round ran: the fleet's own counters are the worker's then
        self.received: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter()

    @property
    def running(self) -> bool:
        """Whether a round runs now: the worker thread has the fleet."""
        return self._answers is not None

    @property
    def busy(self) -> bool:
        """Whether telemetry is held rather than absorbed now: a round runs, or what it left is not absorbed yet."""
        return self._answers is not None or bool(self._held)

    def counters(self) -> tuple[Counter[str], Counter[str]]:
        """Where a push counts what it received and rejected: the fleet's own counters, or the worker's
        while a round runs (merged into the fleet's before the next)."""
        if self._answers is not None:
            return self.received, self.rejected
        fleet = self._fleet()
        return fleet.received, fleet.rejected

    def answer(self, replica_id: str) -> ThresholdUpdate | None:
        """The thresholds published for a replica (``None``: unknown to the fleet)."""
        answers = self._answers
        if answers is not None:
            return answers.get(replica_id)
        replica = self._fleet().replicas.get(replica_id)
        return None if replica is None else replica.current

    async def hold(self, batch: TelemetryBatch) -> asyncio.Future:
        """Keep a push's telemetry for the next round (waiting while :data:`MAX_HELD` are held); that round."""
        while len(self._held) >= MAX_HELD:
            self._space.clear()
            await self._space.wait()
        self._held.append(batch)
        return self.next_round()

    def replan_soon(self, cause: str) -> asyncio.Future:
        """Ask for a re-plan; the future is the round that makes it (its result: the version it published)."""
        self._cause = self._cause or cause
        return self.next_round()

    def next_round(self) -> asyncio.Future:
        """The round that will take the telemetry held and the re-plan asked for so far (started if need be)."""
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
            self._next.add_done_callback(_retrieve)
        if self._rounds is None or self._rounds.done():
            self._rounds = asyncio.get_running_loop().create_task(self._run_rounds())
        return self._next

    async def _run_rounds(self) -> None:
        while self._next is not None:
            async with self.lock:
                held, self._held = self._held, deque()
                cause, self._cause = self._cause, None
                done, self._next = self._next, None
                self._space.set()
                try:
                    version = await self.run(functools.partial(self._absorb_and_replan, held, cause))
                except Exception as exc:
                    logger.exception("controller worker round failed")
                    done.set_exception(exc)
                else:
                    done.set_result(version)

    def _absorb_and_replan(self, held: deque[TelemetryBatch], cause: str | None) -> int:
        """In the worker thread: the held telemetry absorbed in order, then a re-plan if one is due."""
        fleet = self._fleet()
        for batch in held:
            try:
                _, due = fleet.absorb_checked(batch)
            except Exception:
                logger.exception("rejected a telemetry batch that could not be ingested")
                fleet.rejected["bad_batch"] += 1
                continue
            cause = cause or due
        if cause is not None:
            fleet.recompute(cause)
        fleet.expire_overrides()
        return fleet.version

    async def run(self, change: Callable[[], T], force: bool = False) -> T:
        """``change`` (a function of the fleet) in the worker thread, then persisted if it moved the version
        (or ``force``), then published. The caller holds :attr:`lock`."""
        fleet = self._fleet()
        self._merge()
        self._answers = {rid: r.current for rid, r in fleet.replicas.items()}
        try:
            with _switch_interval(SWITCH_INTERVAL_S):
                return await asyncio.get_running_loop().run_in_executor(self._executor, self._work, change, force)
        finally:
            self._answers = None  # published: every reply from here on reads the fleet's thresholds
            self._merge()

    def _work(self, change: Callable[[], T], force: bool) -> T:
        try:
            return change()
        finally:
            try:
                self._persist(force)
            except Exception:  # the store is down: serve on, housekeeping retries
                logger.exception("could not persist the controller state")

    def _merge(self) -> None:
        fleet = self._fleet()
        fleet.received.update(self.received)
        fleet.rejected.update(self.rejected)
        self.received.clear()
        self.rejected.clear()

    async def idle(self) -> None:
        """Wait until no round runs or is due (tests, shutdown)."""
        while self._rounds is not None and not self._rounds.done():
            await asyncio.shield(self._rounds)


def _yield_the_cpu() -> None:
    """Make the worker thread (the one calling this) give way to the event loop's on a shared CPU."""
    if sys.platform.startswith("linux"):  # nice is per thread on Linux only; elsewhere it would be the process's
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WORKER_NICE)


def _retrieve(future: asyncio.Future) -> None:
    """A round's failure is logged where it happens; a round nobody waited for must not log it again."""
    if not future.cancelled():
        future.exception()


@contextlib.contextmanager
def _switch_interval(seconds: float) -> Iterator[None]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(min(before, seconds))
    try:
        yield
    finally:
        sys.setswitchinterval(before)
