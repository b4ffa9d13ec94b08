"""A fleet of simulated replicas behind a router: what routing does to latency when replicas batch in phases.

``R`` replicas, each the step-level :class:`~ebplus.simulator.sim.Simulator` (the real phase machine,
and for online policies the real controller: one :class:`~ebplus.controller.fleet.FleetController`
for the fleet, as in a deployment), share one arrival process. A request is routed when it arrives
(open loop) or when the client issues it after a completion (closed loop): the router
(:mod:`ebplus.deploy.routing`, the same policy objects a deployment runs) reads each replica's
:class:`~ebplus.deploy.routing.PhaseBoard` as it stands then (an ideal board: fresh and exact) and the
request joins that replica's queue.

Time advances replica by replica: the replica whose current step ends first runs its next one, unless
an arrival comes before it. A replica's jump over identical decode steps stops at the fleet's next
arrival (any replica may receive it), so no request is admitted late.

Besides the deployment-wide :class:`~ebplus.simulator.result.SimResult` (the keys of ``ebplus sim run
--json``), a run reports per-replica occupancy (time-averaged running requests over ``N``), requests
routed per replica, and prefill windows: how many opened, and the share that closed with seats left
empty: fewer than ``k`` admitted (a phase's fixed cost spent on fewer admissions than it was sized for).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ebplus.controller.cost_model import HardwareProfile
from ebplus.controller.messages import StepKind
from ebplus.deploy.routing import PhaseAware, PhaseBoard, Router
from ebplus.simulator.result import SimResult, result_of
from ebplus.simulator.sim import SimConfig, Simulator
from ebplus.simulator.workloads import Requests

if TYPE_CHECKING:
    from ebplus.simulator.autoscaling import Autoscaler


@dataclass
class FleetResult:
    """One fleet run: the deployment as a whole (``fleet``) and what each replica did."""

    fleet: SimResult
    router: str
    occupancy: list[float]  # per replica: time-averaged running / N
    routed: list[int]  # per replica: requests the router sent it
    windows: int  # EB prefill windows opened, all replicas
    windows_short: int  # of those, closed having admitted fewer than k (seats left empty)
    fallbacks: int = 0  # decisions the phase router left to power of two choices (stale boards)
    scaling: dict | None = None  # the autoscaler's replica-seconds and scale events (Autoscaler.report)

    def as_json(self) -> dict:
        """``SimResult.as_json``'s keys for the fleet, plus ``replicas``, ``router``, ``occupancy_*``,
        ``routed``, ``windows_opened`` and ``windows_short_share``."""
        out = self.fleet.as_json()
        occ = np.asarray(self.occupancy)
        out.update(
            replicas=len(self.occupancy),
            router=self.router,
            occupancy_mean=float(occ.mean()),
            occupancy_min=float(occ.min()),
            occupancy_max=float(occ.max()),
            routed=self.routed,
            windows_opened=self.windows,
            windows_short_share=self.windows_short / self.windows if self.windows else None,
            router_fallbacks=self.fallbacks,
        )
        if self.scaling is not None:
            out.update(self.scaling)
        return out


class FleetSimulator:
    """``replicas`` replicas (profiles taken in turn from ``profiles``) serving ``requests`` behind ``router``."""

    def __init__(
        self,
        profiles: Sequence[HardwareProfile],
        requests: Requests,
        config: SimConfig,
        replicas: int,
        router: Router,
        scaler: Autoscaler | None = None,
    ) -> None:
        if replicas < 1:
            raise ValueError(f"--replicas must be >= 1, got {replicas}")
        if not profiles:
            raise ValueError("a fleet needs at least one profile")
        first = Simulator(profiles[0], requests, config, replica_id="sim-0")
        self.replicas = [first] + [
            Simulator(profiles[i % len(profiles)], requests, config, replica_id=f"sim-{i}", peer=first)
            for i in range(1, replicas)
        ]
        self.router = router
        self.scaler = scaler
        self.profiles, self.config = list(profiles), config
        #: the replicas the router may choose (started and not draining), by index into ``replicas``
        self.serving = list(range(replicas))
        self.requests = requests
        self.arrivals = first.arrivals
        self.controller = first.controller
        self.now = 0.0
        self._current = first  # the replica stepping: a push is stamped with its clock, as one replica's run is
        if self.controller is not None:
            self.controller.clock = lambda: self._current.now
        # the departure chance a board carries before the controller has an estimate: the workload's mean output
        self._prior_p = 1.0 / max(float(np.mean(requests.output_len)), 1.0)
        self._prior_prompt = float(np.mean(requests.input_len))  # and its mean prompt
        self._occupied = [0.0] * replicas  # running x seconds
        self._routed = [0] * replicas
        self._windows = 0
        self._short = 0  # windows that admitted fewer than k
        self._window_start: list[tuple[int, int] | None] = [None] * replicas  # (admitted before it, its k)
        self._queued = [False] * replicas  # whether a replica has a step in ``_busy``
        self._busy: list[tuple[float, int]] = []  # (when its next step starts, replica) of replicas with work
        self._boards = _Boards(self)

    def board(self, sim: Simulator) -> PhaseBoard:
        """What ``sim`` would publish now (the simulator's boards are fresh and exact)."""
        th = sim.machine.thresholds
        m = sim.m
        queued = int(sim.pleft[:m].sum()) + sum(int(sim.inp[r] + sim.gen[r]) for r in sim.waiting)
        estimate = None if self.controller is None else self.controller.workload.estimate
        return PhaseBoard(
            mode=th.active,
            prefilling=sim.machine.phase is StepKind.PREFILL,
            running=m,
            waiting=len(sim.waiting),
            n=th.n,
            k=th.effective_k,
            freed=sim.machine.freed(m),
            prefill_tokens=queued,
            kv_tokens=sim.used,
            step_end_s=sim.now,
            decode_step_s=sim.cost.step_seconds(0, max(m, 1), sim.used),
            departure_p=self._prior_p if estimate is None else estimate.p0,
            prefill_s_per_token=sim.cost.beta_p,
            published_s=self.now,
            slot_s=math.inf if (slot := sim.machine.next_slot(sim.now)) is None else slot,
            cost=sim.cost,
            prompt_tokens=self._prior_prompt if estimate is None else estimate.mu_l,
        )

    def _route(self, rid: int) -> None:
        i = self.serving[self.router.choose(self._boards, self.now)]
        self._boards.changed(i)
        sim = self.replicas[i]
        sim.waiting.append(rid)
        self._routed[i] += 1
        if not self._queued[i]:  # it was idle: its next step starts now
            sim.now = max(sim.now, self.now)
            heapq.heappush(self._busy, (sim.now, i))
            self._queued[i] = True

    def add_replica(self) -> None:
        """A new replica, serving from now (an autoscaler's, once its start-up is over)."""
        i = len(self.replicas)
        sim = Simulator(self.profiles[i % len(self.profiles)], self.requests, self.config, replica_id=f"sim-{i}",
                        peer=self.replicas[0], start_s=self.now)  # fmt: skip
        self.replicas.append(sim)
        for per_replica, value in ((self._occupied, 0.0), (self._routed, 0), (self._window_start, None), (self._queued, False)):
            per_replica.append(value)  # type: ignore[attr-defined]
        self._serve([*self.serving, i])

    def drain_replica(self, i: int) -> None:
        """Route nothing more to replica ``i``; it leaves (:meth:`_left`) once it has served what it holds."""
        self._serve([j for j in self.serving if j != i])
        if not self._queued[i]:
            self._left(i)

    def _serve(self, serving: list[int]) -> None:
        self.serving = serving
        if isinstance(self.router, PhaseAware):  # the window it fills is by position among the served
            self.router.filling = None

    def _left(self, i: int) -> None:
        if self.controller is not None:
            self.controller.forget(self.replicas[i].replica_id)
        if self.scaler is not None:
            self.scaler.changed(self)

    def run(self) -> FleetResult:
        """Serve every request; returns the fleet's result.

        Events in time order: a step's completions reach the clients when the step ends (a closed-loop
        client issues its next request then), arrivals, then the next step of the replica whose current
        one ends first; at a tie in that order, as one replica's run sees them.
        """
        total = len(self.requests)
        busy = self._busy
        ended: list[tuple[float, int]] = []  # (when a step ended, its completions) not yet seen by the clients
        finished = 0
        while finished < total:
            nxt = self.arrivals.next_time()
            start = busy[0][0] if busy else math.inf
            arrival = math.inf if nxt is None else nxt
            if self.scaler is not None and self.scaler.next_tick <= min(start, arrival, ended[0][0] if ended else math.inf):
                self.now = max(self.now, self.scaler.next_tick)
                self.scaler.tick(self)
                continue
            if ended and ended[0][0] <= min(start, arrival):
                t, completions = heapq.heappop(ended)
                self.now = max(self.now, t)
                self.arrivals.inflight -= completions
                self._route_all(self.arrivals.poll(self.now))
                continue
            if nxt is not None and nxt <= start:
                self.now = max(self.now, nxt)
                self._route_all(self.arrivals.poll(self.now))
                continue
            if not busy:  # nothing running or ending: a saturated phase issues at once
                issued = self.arrivals.poll(self.now)
                if not issued:
                    raise RuntimeError("fleet simulator stalled: nothing running, queued or arriving")
                self._route_all(issued)
                continue
            _, i = heapq.heappop(busy)
            sim = self.replicas[i]
            self.now = start
            done = sim.finished
            self._current = sim
            self._step(i, sim)
            self._boards.changed(i)
            if sim.finished > done:  # the clients learn of them when the step ends, not when it starts
                finished += sim.finished - done
                self.arrivals.inflight += sim.finished - done
                heapq.heappush(ended, (sim.now, sim.finished - done))
            if sim.m or sim.waiting:
                heapq.heappush(busy, (sim.now, i))
            else:
                self._queued[i] = False
                if i not in self.serving:  # a drained replica: nothing left to serve
                    self._left(i)
        for sim in self.replicas:
            self._current = sim
            sim.flush_telemetry()
        return self._result()

    def _route_all(self, rids: list[int]) -> None:
        for rid in rids:
            self._route(rid)

    def _step(self, i: int, sim: Simulator) -> None:
        before, phases = sim.now, sim.machine.stats.prefill_phases
        admitted_before = self._routed[i] - len(sim.waiting)  # ever admitted (a preempted one counts again)
        was_prefilling = sim.machine.phase is StepKind.PREFILL
        sim.step()
        self._occupied[i] += sim.m * (sim.now - before)
        if sim.machine.stats.prefill_phases > phases:  # a window opened with this step
            self._windows += 1
            self._window_start[i] = (admitted_before, sim.machine.thresholds.effective_k)
        elif was_prefilling and sim.machine.phase is StepKind.DECODE and self._window_start[i] is not None:
            mark, k = self._window_start[i]
            self._short += self._routed[i] - len(sim.waiting) - mark < k
            self._window_start[i] = None

    def _result(self) -> FleetResult:
        fleet = result_of(self.replicas)
        span = fleet.sim_seconds or 1.0
        occupancy = [occ / span / s.machine.thresholds.n for occ, s in zip(self._occupied, self.replicas, strict=True)]
        fallbacks = self.router.fallbacks if isinstance(self.router, PhaseAware) else 0
        scaling = None if self.scaler is None else self.scaler.report(self.now)
        return FleetResult(
            fleet, self.router.name, occupancy, list(self._routed), self._windows, self._short, fallbacks, scaling
        )


class _Boards(Sequence[PhaseBoard]):
    """The replicas' boards as the router reads them: each built when first read after its replica changed
    (a step, a routed request), so an arrival costs the boards that moved, not all ``R``."""

    def __init__(self, fleet: FleetSimulator) -> None:
        self.fleet = fleet
        self._cache: dict[int, PhaseBoard] = {}  # by replica index

    def changed(self, i: int) -> None:
        self._cache.pop(i, None)

    def __len__(self) -> int:
        return len(self.fleet.serving)

    def __iter__(self) -> Iterator[PhaseBoard]:
        return (self[j] for j in range(len(self)))

    def __getitem__(self, j: int) -> PhaseBoard:  # type: ignore[override]
        i = self.fleet.serving[j]  # the j-th replica the router may choose
        board = self._cache.get(i)
        if board is None:
            board = self._cache[i] = self.fleet.board(self.fleet.replicas[i])
        return board


def simulate_fleet(
    profiles: Sequence[HardwareProfile],
    requests: Requests,
    config: SimConfig,
    replicas: int,
    router: Router,
    scaler: Autoscaler | None = None,
) -> FleetResult:
    """Run one fleet simulation (see :class:`FleetSimulator`; ``scaler``: replicas added and removed as it says)."""
    return FleetSimulator(profiles, requests, config, replicas, router, scaler).run()
