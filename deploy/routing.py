"""Which replica a request goes to: two baselines and the EB-phase-aware router, as pure policy.

One implementation for every host: the fleet simulator (:mod:`ebplus.simulator.fleet`) calls
:meth:`Router.choose` with boards it reads off its replicas, and a deployment's request router
calls it with the boards its replicas last published. No vLLM or Ray import, and no call that
waits: a router decides from the boards it holds.

Each replica publishes a :class:`PhaseBoard`: its mode and phase, its slots, its queue, and what
its next prefill window needs (``k``, the slots freed since the last window closed, the chance
a running request finishes in a decode step). Under exclusive batching a request that arrives
while a replica decodes waits until that replica opens its next prefill window, and a window opens
only once ``k`` requests can be admitted (``replicas/phases.py``); a router that sees only queue
lengths sends requests to a replica that will not prefill for seconds while another opens a window
now. :func:`admission_eta` turns a board into when a request routed there now would be admitted.

Routers (``ROUTERS``, by name):

* ``default``: Ray Serve's default, power of two choices on queue length (running + waiting);
* ``least-loaded``: the least token load in the manner of Ray Serve LLM's KV-aware routing: the
  prompt tokens a replica still has to prefill plus the KV tokens its decodes read every step;
* ``phase``: the soonest admission (:func:`admission_eta`); admissions within one decode step count as
  equal, and of those the EB replica whose window already holds the most requests (up to ``k``) wins (the
  requests that follow one fill the window it booked, since that window then opens soonest), then the
  replica whose step that prefills the request delays the others least (its cost model prices it), then
  the least token load; a replica holding more than ``load_cap`` (1.25) times the mean queue is passed
  over, since the soonest admission favours the replica that already runs the most; a board older than
  ``stale_s`` makes it fall back to power of two choices.
"""

from __future__ import annotations

import math
import random
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar, Protocol

from ebplus.controller.cost_model import CostModel
from ebplus.controller.messages import Mode, PhaseReport, RoutingHints


@dataclass(frozen=True)
class PhaseBoard:
    """What one replica publishes for routing, at ``published_s`` (seconds on the routers' clock).

    Attributes:
        mode: the batching it runs now (``EB`` or ``MB``; an EB+ replica publishes its active mode).
        prefilling: under EB, a prefill window is open (it admits at its next step).
        running, waiting: requests holding a slot, and queued ones.
        n: the running cap (``N``); ``k``: EB's threshold.
        freed: slots freed since its last prefill window closed (EB also opens a window once ``k`` left).
        prefill_tokens: prompt tokens queued or not yet computed.
        kv_tokens: KV tokens its running requests hold (what every decode step reads).
        step_end_s: when its current step ends (it decides the next one then).
        decode_step_s: seconds of its last decode step.
        departure_p: the chance a running request finishes in one decode step (the controller's ``p0``).
        prefill_s_per_token: seconds one queued prompt token costs (the cost model's ``beta_p``).
        slot_s: under a staggered EB, when its timer next opens a window for a waiting request
            (``PhaseMachine.next_slot``; ``inf``: no stagger).
        cost: its step-time model (the controller's; ``None`` where unknown): it prices what a prompt adds to
            the step that prefills it.
        prompt_tokens: the mean prompt a request brings (0 where unknown).
    """

    mode: Mode
    prefilling: bool
    running: int
    waiting: int
    n: int
    k: int
    freed: int
    prefill_tokens: int
    kv_tokens: int
    step_end_s: float
    decode_step_s: float
    departure_p: float
    prefill_s_per_token: float
    published_s: float
    slot_s: float = math.inf
    cost: CostModel | None = None
    prompt_tokens: float = 0.0

    @classmethod
    def of(cls, report: PhaseReport, hints: RoutingHints, replica_id: str, leased: int = 0) -> PhaseBoard:
        """A deployment's board: the engine's ``report`` (read between two steps, so its current step ends when
        it was read) with the controller's ``hints``, and ``leased`` requests a router sent it that the report
        does not count yet: queued behind the others, each with the mean prompt to prefill. A router that did not
        count them would send every request until the next report where the first one went (a herd). Before the
        controller has an estimate, the departure chance and the prompt are the engine's own means (none before
        its first finished request)."""
        p0 = hints.p0 if hints.p0 is not None else (1.0 / report.mean_output if report.mean_output >= 1 else 0.0)
        prompt = hints.mu_l if hints.mu_l is not None else report.mean_prompt
        return cls(
            mode=report.mode,
            prefilling=report.prefilling,
            running=report.running,
            waiting=report.waiting + leased,
            n=report.n,
            k=report.k,
            freed=report.freed,
            prefill_tokens=report.prefill_tokens + round(leased * prompt),
            kv_tokens=report.kv_tokens,
            step_end_s=report.read_at,
            decode_step_s=report.decode_step_s,
            departure_p=p0,
            prefill_s_per_token=hints.beta_p.get(replica_id, 0.0),
            published_s=report.read_at,
            slot_s=math.inf if report.slot_at is None else report.slot_at,
            cost=hints.cost.get(replica_id),
            prompt_tokens=prompt,
        )

    @property
    def queue(self) -> int:
        """Requests it holds (what Ray Serve's default router compares)."""
        return self.running + self.waiting

    @property
    def token_load(self) -> int:
        return self.prefill_tokens + self.kv_tokens

    @cached_property
    def per_departure_s(self) -> float:
        """Seconds until the next running request finishes: a decode step over ``running x departure_p``."""
        per_step = self.running * self.departure_p
        return math.inf if per_step <= 0 else self.decode_step_s / per_step

    @cached_property
    def join_delay_s(self) -> float:
        """The request-seconds a mean prompt sent here adds to the others: the seconds the step that prefills it
        gains, by the cost model, times the requests that step holds up. Under MB that step is the next one,
        mixing the prompt into the decodes, and it holds up the decodes and the new request. Under EB it is
        the prefill phase, a prefill-only step (its fixed cost too when nothing is queued for it), and it holds
        up the decodes it pauses, the requests queued for it and the new one. 0 where the cost or the mean
        prompt is unknown.

        A mixed step prices every token at the mixed rate of its decode share, so the same prompt costs
        different replicas different delays. On a GPU where mixing interferes (the RTX PRO 6000 profile) a
        prompt that turns a decode-only step into a mixed one costs its decodes more than one joining a step
        that mixes already; where it does not (the H200 profile) the reverse. The cost model decides, not a
        rule of thumb; and the same measure prices an EB replica's pause, so a fleet whose replicas run
        different modes (EB+) compares them in one unit.
        """
        if self.cost is None or self.prompt_tokens <= 0:
            return 0.0
        step, queued, prompt = self.cost.step_seconds, self.prefill_tokens, round(self.prompt_tokens)
        if self.mode is Mode.MB:
            m, kv = self.running, self.kv_tokens
            return max(0.0, step(queued + prompt, m, kv) - step(queued, m, kv)) * (m + 1)
        return max(0.0, step(queued + prompt, 0, 0) - step(queued, 0, 0)) * (self.running + self.waiting + 1)

    @cached_property
    def waits(self) -> tuple[float, float, int, float, float]:
        """What :func:`admission_eta` adds to the current step's end for a request routed here, kept with the
        board (a router asks every board on every request): the seconds until a slot is free for it (those
        queued ahead take the first), until ``k`` left since the last window (EB decoding), the requests
        more that would open the window by its queue, the seconds until ``k`` slots are free for them, and
        the prompt tokens queued before it."""
        free, queued, dep = self.n - self.running, self.waiting + 1, self.per_departure_s
        seat = max(0, queued - free)
        seat_s = seat * dep if seat else 0.0
        freed_s = queue_s = 0.0
        short = 0
        if self.mode is Mode.EB and not self.prefilling and self.running > 0:
            by_freed = max(0, self.k - self.freed, 1 - free)
            freed_s = by_freed * dep if by_freed else 0.0
            short = max(0, self.k - queued)
            queue_s = max(0, self.k - free) * dep if self.k > free else 0.0
        return seat_s, freed_s, short, queue_s, self.prefill_tokens * self.prefill_s_per_token


def admission_eta(board: PhaseBoard, now: float, arrival_rate: float = 0.0) -> float:
    """Seconds from ``now`` until a request routed to ``board`` now starts its prefill.

    The current step's end; then its seat (the departures that free one for it) and, under EB while
    decoding, its window: the soonest of ``k`` departures since the last one, a queue of ``k``, which
    the requests that follow fill at ``arrival_rate`` (requests/s the router places: a router that
    keeps sending here books the window full), and a staggered window's slot; then the prompt tokens
    queued before it.
    """
    seat_s, freed_s, short, queue_s, prefill_s = board.waits
    window = 0.0
    if freed_s or short or queue_s:
        fill_s = 0.0 if not short else (short / arrival_rate if arrival_rate > 0 else math.inf)
        window = min(freed_s, max(fill_s, queue_s), max(0.0, board.slot_s - board.step_end_s))
    return max(0.0, board.step_end_s - now) + max(seat_s, window) + prefill_s


#: The phase router's default cap on what a replica holds, a multiple of the mean queue (:class:`PhaseAware`).
LOAD_CAP = 1.25


class Router(Protocol):
    """Picks the index of the replica a request goes to, from the boards it holds (never an empty list)."""

    name: ClassVar[str]

    def choose(self, boards: Sequence[PhaseBoard], now: float) -> int: ...


class PowerOfTwo:
    """Ray Serve's default: of two replicas drawn at random, the one holding fewer requests."""

    name: ClassVar[str] = "default"

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    def choose(self, boards: Sequence[PhaseBoard], now: float) -> int:
        if len(boards) == 1:
            return 0
        i, j = self.rng.sample(range(len(boards)), 2)
        return i if boards[i].queue <= boards[j].queue else j


class LeastLoaded:
    """The replica with the least token load: prompt tokens to prefill plus KV tokens its decodes read."""

    name: ClassVar[str] = "least-loaded"

    def __init__(self, seed: int = 0) -> None:
        del seed  # deterministic: ties go to the lowest index

    def choose(self, boards: Sequence[PhaseBoard], now: float) -> int:
        return min(range(len(boards)), key=lambda i: boards[i].token_load)


class PhaseAware:
    """The replica that admits the request soonest (:func:`admission_eta`), ties broken by the fullest window.

    Booking a window by its queue is a promise about the requests that follow: the first ones wait
    until ``k`` are there. So the router fills one window at a time: once it sends a request to a
    replica whose window needs more requests, it keeps sending there until that window no longer waits
    on its queue (it opened, ``k`` are queued, or the replica's decodes finished), even where another
    replica would admit one sooner. Without that, a window booked by a few requests was left for open
    windows elsewhere, and they waited for ``k`` departures instead. Sending a request elsewhere when that
    admits it sooner by more than the wait it adds to those booked (one gap between requests each) was
    measured and not kept: it raised the TTFT p99 after the controller's first plan by 18 to 30 % in the
    EB cells at 80 % of H200 fleets of 4 (``docs/benchmarks/fleet.md``, the cold threshold).

    Ties. Admissions less than one decode step apart (the fastest replica's step, at least ``tie_s``)
    count as equal: a board is an estimate that moves a step at a time. Of those, the EB replica whose
    queue already holds the most requests (up to ``k``) wins, then the replica whose step that prefills
    the request delays the others least (:attr:`PhaseBoard.join_delay_s`), then the least token load. A
    prefill phase pays its fixed cost once for every request it admits; sending a request to the replica
    whose window opens a step sooner but would admit it alone opened windows with empty seats (18-30 %
    of them in RTX PRO 6000 fleets at 95 % of their capacity, which lost 1.2-1.6 % of their throughput
    to them: ``benchmarks/fleet_bench.py``). Under MB a prompt mixes into the decodes' next step and
    slows every one of them; sending it to the replica whose step ends soonest, with no regard to that,
    mixed prefills into as many steps as it could: RTX PRO 6000 fleets of 16 in MB at 95 % (Poisson) had
    0.989 of the better baseline's throughput and 1.27 times the default router's TPOT p99.

    A cap on what a replica holds. Under EB the soonest admission favours the replica that already runs the
    most: the more it runs, the sooner ``k`` of them leave and open its window. Left alone that feeds
    itself: in an RTX PRO 6000 fleet of 4 at half its capacity one replica ran 136 requests on average and
    the other three 55 to 58, its decode steps slowed, and the fleet's TPOT p99 was 2.8x the default
    router's. So a replica holding more than ``load_cap`` times the mean queue (running + waiting, over the
    boards it chooses among), plus one, is not a candidate while another is (the bound of consistent
    hashing with bounded loads). A window the router is filling is still filled. What it changed, and what
    it costs: ``docs/benchmarks/fleet.md``.

    ``tie_s``: admissions this close always count as equal. ``tie_steps``: the tie in decode steps (1; two
    steps fill more windows near saturation and delay more requests at every load: the fleet benchmark's
    ``--phase-tie-steps``). ``load_cap``: the cap above (1.25; ``math.inf``: none; the fleet benchmark's
    ``--phase-load-cap``). ``stale_s``: a board older than this, at any replica, means the boards cannot be
    trusted (their channel is down or slow): power of two choices until they are fresh again.
    """

    name: ClassVar[str] = "phase"
    #: weight of the newest gap in the arrival rate's average (about the last 20 requests)
    RATE_EMA = 0.05

    def __init__(
        self,
        seed: int = 0,
        tie_s: float = 0.005,
        stale_s: float = 2.0,
        tie_steps: float = 1.0,
        load_cap: float = LOAD_CAP,
    ) -> None:
        if not load_cap >= 1.0:
            raise ValueError(f"load_cap must be at least 1 (a multiple of the mean queue), got {load_cap}")
        self.tie_s = tie_s
        self.tie_steps = tie_steps
        self.load_cap = load_cap
        self.stale_s = stale_s
        self.fallback = PowerOfTwo(seed)
        self.fallbacks = 0  # decisions made by the fallback
        self.filling: int | None = None  # the replica whose window it is filling by its queue
        self._last: float | None = None
        self._gap: float | None = None  # mean seconds between the requests it placed

    @property
    def arrival_rate(self) -> float:
        """Requests/s this router has been placing (0 until it has seen two)."""
        return 1.0 / self._gap if self._gap else 0.0

    def choose(self, boards: Sequence[PhaseBoard], now: float) -> int:
        if self._last is not None and now >= self._last:
            gap = now - self._last
            self._gap = gap if self._gap is None else self._gap + self.RATE_EMA * (gap - self._gap)
        self._last = now
        if self.stale_s < math.inf and any(now - b.published_s > self.stale_s for b in boards):
            self.fallbacks += 1
            self.filling = None
            return self.fallback.choose(boards, now)
        rate = self.arrival_rate
        filling = self.filling if self.filling is not None and self.filling < len(boards) else None
        # while filling a window, this one goes where the others wait (the last of k opens it)
        best = filling if filling is not None else self._soonest(boards, [admission_eta(b, now, rate) for b in boards])
        self.filling = best if boards[best].waits[2] else None
        return best

    def _soonest(self, boards: Sequence[PhaseBoard], etas: list[float]) -> int:
        steps = [b.decode_step_s for b in boards if b.decode_step_s > 0]
        tie = max(self.tie_s, self.tie_steps * min(steps)) if steps else self.tie_s
        candidates: Sequence[int] = range(len(boards))
        if self.load_cap < math.inf:  # the least-held replica is always under the cap: never empty
            cap = self.load_cap * sum(b.queue for b in boards) / len(boards) + 1
            candidates = [i for i in candidates if boards[i].queue <= cap]
        soonest = min(etas[i] for i in candidates)
        near = [i for i in candidates if etas[i] <= soonest + tie]
        return min(near, key=lambda i: (-_window_fill(boards[i]), boards[i].join_delay_s, boards[i].token_load))


def _window_fill(board: PhaseBoard) -> int:
    """Requests an EB replica's next prefill window would admit besides a new one (its queue, up to ``k``)."""
    return min(board.waiting, board.k) if board.mode is Mode.EB else 0


#: The deployment's board routers (``ebplus.deploy.request_router``) living in this process, for
#: ``GET /admin/routing``. Here and not in their module: Ray Serve ships a router class by value, so that
#: module's globals are a copy in every process that runs one, and this one is imported by reference.
LIVE: weakref.WeakSet[Any] = weakref.WeakSet()

ROUTERS: dict[str, type[PowerOfTwo] | type[LeastLoaded] | type[PhaseAware]] = {
    r.name: r for r in (PowerOfTwo, LeastLoaded, PhaseAware)
}


def make_router(
    name: str, seed: int = 0, stale_s: float = 2.0, tie_steps: float = 1.0, load_cap: float = LOAD_CAP
) -> PowerOfTwo | LeastLoaded | PhaseAware:
    """The router called ``name`` (a key of :data:`ROUTERS`); ``ValueError`` naming the choices otherwise.
    ``stale_s``: the phase router's board age limit (``math.inf`` where boards are exact, as in simulation);
    ``tie_steps`` and ``load_cap``: its tie in decode steps and its cap on a replica's queue (:class:`PhaseAware`)."""
    if name not in ROUTERS:
        raise ValueError(f"unknown router {name!r}; choose from {', '.join(ROUTERS)}")
    if name == PhaseAware.name:
        return PhaseAware(seed, stale_s=stale_s, tie_steps=tie_steps, load_cap=load_cap)
    return ROUTERS[name](seed)
