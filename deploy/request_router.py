"""The routers of :mod:`ebplus.deploy.routing` in a deployment: a Ray Serve ``RequestRouter`` over phase boards.

Ray Serve makes one request router per deployment handle in each process that calls the deployment (here,
each ingress replica) and asks it for a replica per request (``choose_replicas``). :class:`BoardRouter`
answers with a policy of :mod:`ebplus.deploy.routing` (``phase`` or ``least-loaded``: the same object the
fleet simulator runs) over the boards it holds: each replica's latest
:class:`~ebplus.controller.messages.PhaseReport` with the controller's
:class:`~ebplus.controller.messages.RoutingHints` (:meth:`~ebplus.deploy.routing.PhaseBoard.of`), plus the
requests this router sent there that the report does not count yet (leases: released by the first report
read after the request reached the replica, or when the request completes).

NOTE: Ray Serve ships this class to the calling processes by value (cloudpickle), with a copy of this module's
globals: state shared with the rest of the process (the registry ``/admin/routing`` reads) lives in modules it
imports, which travel by reference.

A background task long-polls the board actor (:mod:`ebplus.replicas.board`) for newer reports; the decision
awaits nothing. When a candidate has no board, or one older than ``stale_s`` (the channel is down or slow),
the router leaves the choice to Ray's own policy, power of two choices on the replicas' queue lengths, and
counts it. Ray still checks that the chosen replica has room (``max_ongoing_requests``), as for its own router.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ray.serve.request_router import FIFOMixin, PendingRequest, ReplicaID, RequestRouter, RunningReplica

from ebplus.controller.messages import PhaseReport, RoutingHints, WireError, decode
from ebplus.deploy import routing
from ebplus.deploy.priority import RouterThread, prioritize_router_thread
from ebplus.deploy.routing import LOAD_CAP, PhaseAware, PhaseBoard, make_router
from ebplus.replicas.board import WATCH_TIMEOUT_S, get_board

logger = logging.getLogger("ray.serve.ebplus")

#: A report read this long after a request was routed counts it (the request has reached the engine).
LEASE_TRANSIT_S = 0.05
#: Pulls of the board per publishing interval at most: the replicas' reports arrive spread over an interval
#: (the long poll answers at the first), so a board is at most half an interval older than its report. Each
#: pull costs the board actor and this process an actor call: on the CPU test bed, where the engines share
#: two cores with everything else, five a 50 ms interval measurably slowed the engines.
PULLS_PER_INTERVAL = 2
#: Decision times kept for the percentiles ``/admin/routing`` reports.
TIMINGS = 10_000
#: The two clocks a decision is timed on: the wall clock (what the request waits) and the router thread's CPU
#: time (what the decision itself costs). Where the cores are oversubscribed, as on the CPU test bed whose two
#: cores also run both engines, the wall clock's tail is the time the thread waited for a core, not its work.
CLOCKS = {"decision_us": time.perf_counter, "decision_cpu_us": time.thread_time}


@dataclass
class Board:
    """A replica's board as this router holds it: its last report and the requests routed there since.

    The :class:`PhaseBoard` the policy reads is built once per change (a report, a lease, new hints), not per
    decision: a decision reads every candidate's board, and the policy caches what it derives on the board.
    """

    report: PhaseReport
    leases: dict[str, float]  # internal request id -> when it was routed
    view: PhaseBoard | None = None

    def board(self, hints: RoutingHints, replica_id: str) -> PhaseBoard:
        if self.view is None:
            self.view = PhaseBoard.of(self.report, hints, replica_id, len(self.leases))
        return self.view


class BoardRouter(FIFOMixin, RequestRouter):
    """A Ray Serve request router running a policy of :mod:`ebplus.deploy.routing` over the replicas' boards.

    ``request_router_kwargs`` (``initialize_state``): ``policy`` (``phase`` or ``least-loaded``), ``stale_s``
    (older boards mean the channel is down: Ray's power of two choices decides), ``interval_s`` (the replicas'
    publishing interval), ``load_cap`` (the phase policy's cap on what a replica holds; ``None``: none).
    """

    def initialize_state(
        self, policy: str = "phase", stale_s: float = 2.0, interval_s: float = 0.1, load_cap: float | None = LOAD_CAP
    ) -> None:
        self.policy_name = policy
        self.load_cap = load_cap
        cap = math.inf if load_cap is None else load_cap
        self.policy = make_router(policy, seed=random.randrange(2**31), stale_s=math.inf, load_cap=cap)
        self.stale_s = stale_s
        self.interval_s = interval_s
        self.boards: dict[str, Board] = {}
        self.hints = RoutingHints()
        self._hints_raw = b""  # their bytes: hints carry every replica's cost model, decoded only when they change
        self.decisions = 0
        self.fallbacks = 0
        self.refused = 0  # reports that did not decode
        self.timings: dict[str, deque[float]] = {name: deque(maxlen=TIMINGS) for name in CLOCKS}
        self._order: tuple[str, ...] = ()
        self._watching: asyncio.Task | None = None
        self.thread: RouterThread | None = None
        self._thread_set = False
        routing.LIVE.add(self)
        with contextlib.suppress(RuntimeError):  # Serve makes it on the router's loop: boards before the first request
            self._ensure_watching()

    def _ensure_watching(self) -> None:
        if self._watching is None or self._watching.done():
            self._watching = asyncio.get_running_loop().create_task(self._watch())

    # -- the decision ---------------------------------------------------------

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        self._ensure_watching()
        if not self._thread_set:  # here, not in initialize_state: this is surely the routers' thread
            self._thread_set = True
            self.thread = prioritize_router_thread()
        started = {name: clock() for name, clock in CLOCKS.items()}
        if not candidate_replicas:
            return []
        ids = tuple(r.replica_id.unique_id for r in candidate_replicas)
        if ids != self._order:  # the policy's memory (the window it fills) is by position
            self._order = ids
            if isinstance(self.policy, PhaseAware):
                self.policy.filling = None
        boards = self._boards(ids, time.time())
        if boards is None:
            self.fallbacks += 1
            chosen = random.sample(candidate_replicas, min(2, len(candidate_replicas)))  # Ray takes the shorter queue
        else:
            chosen = [candidate_replicas[self.policy.choose(boards, time.time())]]
        self.decisions += 1
        for name, clock in CLOCKS.items():
            self.timings[name].append(clock() - started[name])
        return [chosen]

    def _boards(self, ids: tuple[str, ...], now: float) -> list[PhaseBoard] | None:
        """The candidates' boards, or ``None`` when one is missing or stale."""
        boards = []
        for rid in ids:
            board = self.boards.get(rid)
            if board is None or now - board.report.read_at > self.stale_s:
                return None
            boards.append(board.board(self.hints, rid))
        return boards

    # -- leases ---------------------------------------------------------------

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        board = self.boards.get(replica_id.unique_id)
        if board is not None:
            board.leases[pending_request.metadata.internal_request_id] = time.time()
            board.view = None

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        board = self.boards.get(replica_id.unique_id)
        if board is not None and board.leases.pop(internal_request_id, None) is not None:
            board.view = None

    # -- the board channel ----------------------------------------------------

    def take(self, version: int, newer: dict[str, bytes], present: list[str], hints: bytes) -> None:
        """Apply one answer of the board actor's ``watch``: newer reports, the replicas still on it, the hints."""
        for rid, payload in newer.items():
            try:
                report = decode(payload, PhaseReport)
            except WireError:
                self.refused += 1
                continue
            board = self.boards.get(rid)
            if board is None:
                self.boards[rid] = Board(report, {})
                continue
            counted = report.read_at - LEASE_TRANSIT_S  # routed before this: the report counts it
            board.report, board.view = report, None
            board.leases = {req: at for req, at in board.leases.items() if at > counted}
        for rid in set(self.boards) - set(present):
            del self.boards[rid]
        if hints == self._hints_raw:  # as last time (they move only when the controller re-estimates)
            fresh = self.hints
        else:
            self._hints_raw = hints
            try:
                fresh = decode(hints, RoutingHints)
            except WireError:
                self.refused += 1
                fresh = self.hints
        if fresh != self.hints:
            self.hints = fresh
            for board in self.boards.values():
                board.view = None
        # Built here, off the request path: otherwise the first decision after a pull rebuilt every board it
        # read (at 256 replicas, most of a millisecond). A decision then rebuilds only the board it leased.
        for rid, board in self.boards.items():
            _ = board.board(self.hints, rid).waits

    async def _watch(self) -> None:
        """Pull the board actor's newer reports, at most once an interval, until the router goes away."""
        version, handle, down = 0, None, False
        while True:
            try:
                if handle is None:
                    handle = await asyncio.to_thread(get_board)
                    if handle is None:
                        raise LookupError("the board actor is not running")
                async with asyncio.timeout(WATCH_TIMEOUT_S + 5):  # not wait_for: see board.publish_forever
                    answer = await handle.watch.remote(version, WATCH_TIMEOUT_S)
                if answer[0] < version:  # a restarted actor counts from 0 again: take all it has
                    version = 0
                    continue
                self.take(*answer)
                version = answer[0]
                if down:
                    logger.info("router of %s: the phase board answers again", self._deployment_id)
                down = False
                await asyncio.sleep(self.interval_s / PULLS_PER_INTERVAL)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # boards go stale, and routing falls back, until it answers again
                handle = None
                if not down:
                    logger.warning("router of %s: no phase board (%s); power of two choices", self._deployment_id, exc)
                down = True
                await asyncio.sleep(1.0)

    # -- what /admin/routing shows ---------------------------------------------

    def view(self) -> dict[str, Any]:
        """This router's counters, decision-time percentiles (each clock of :data:`CLOCKS`) and the boards as it
        reads them now."""
        now = time.time()

        boards = {}
        for rid, board in self.boards.items():
            b = board.board(self.hints, rid)
            boards[rid] = {
                "mode": b.mode.value,
                "prefilling": b.prefilling,
                "running": b.running,
                "waiting": b.waiting,
                "leased": len(board.leases),
                "n": b.n,
                "k": b.k,
                "freed": b.freed,
                "age_s": round(now - b.published_s, 4),
            }
        return {
            "deployment": str(self._deployment_id),
            "policy": self.policy_name,
            "load_cap": self.load_cap if isinstance(self.policy, PhaseAware) else None,
            "decisions": self.decisions,
            "fallbacks": self.fallbacks,
            "refused_reports": self.refused,
            "thread": None if self.thread is None else {"id": self.thread.native_id, "niceness": self.thread.niceness},
            **{name: percentiles_us(times) for name, times in self.timings.items()},
            "boards": boards,
        }


def percentiles_us(seconds: Iterable[float]) -> dict[str, float | int | None]:
    """p50 and p99 of ``seconds``, in microseconds (``None`` before the first decision), and how many."""
    times = sorted(seconds)

    def pct(q: float) -> float | None:
        return None if not times else times[min(len(times) - 1, int(q * len(times)))] * 1e6

    return {"p50": pct(0.5), "p99": pct(0.99), "n": len(times)}
