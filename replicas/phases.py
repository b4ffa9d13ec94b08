"""The EB+ phase machine: what kind of step an engine runs next.

One implementation, no vLLM or Ray import: the simulator (``simulator/sim.py``) and
the vLLM scheduler subclass (``replicas/scheduler.py``) both call
:meth:`PhaseMachine.decide` before every step and :meth:`PhaseMachine.observe`
after it, so the policy measured in simulation is the one that serves traffic.

The machine only says *which kinds of work* a step may contain and how many new
requests it may admit; the engine still picks the requests, allocates KV blocks
and preempts on shortage (vLLM's own paths).

Policies:

* ``MB`` (vLLM v1 / Sarathi): every step runs all decodes, then fills the token
  budget with prompt chunks, admitting while fewer than ``n`` requests run.
* ``EB`` (exclusive): decode-only steps until ``k`` requests can be admitted,
  i.e. ``min(waiting, n - running) >= k``, then a prefill-only phase that refills
  up to ``n`` (over several steps when chunked by the token budget), then back to
  decoding. Under saturation this is the paper's "switch when k of the N slots
  are free"; under light load (``running + waiting = c < n``) it is the same
  rule applied to the observed concurrency. With nothing left to decode, waiting
  requests are prefilled at once (never idle with work queued).
  Fewer than ``k`` waiting requests are admitted once ``k`` requests have left
  the batch since the last prefill phase ended: the paper's rule counted in
  freed slots. Without it, the last requests of a burst (no more arrivals, so
  the queue never reaches ``k``) would wait until the whole batch finished -
  a stall of one full output length with most slots free.
  With ``prefill_steps = L > 0`` a prefill phase longer than ``L`` steps (long
  prompts chunked by the budget) runs one decode-only step after every ``L``
  prefill steps, so no running request waits longer than ``L`` prefill steps for
  its next token; with ``prefill_tokens = T > 0`` each prefill step carries at
  most ``T`` prompt tokens (a smaller step budget). The decode step is an ordinary
  one and chunking does not change what is computed: outputs do not change.
  With ``stagger_period_s = P > 0`` (the controller's stagger, ``controller/stagger.py``) a window
  also opens, with any number of admissible requests, at the first step on or after each time
  ``(j + stagger_phase) * P`` on the fleet's shared clock (``EngineView.now``) unless one opened
  since then: replicas given phases ``i / R`` take turns, so some replica opens a window every
  ``P / R`` seconds while requests wait, instead of all of them at random times.
* ``V0``: EB with ``k = 1`` (prefill-first).
* ``AUTO`` (EB+): ``EB`` or ``MB`` as the controller chose (``ThresholdUpdate.active``);
  ``SHADOW`` always runs ``MB`` (the controller's choice is only published).

KV shortage (EB only; MB steps always carry the decodes, so a failed admission
costs nothing there):

* predictive: an engine that can tell whether the next waiting request's KV
  blocks fit now sets ``EngineView.head_fits``; while it is ``False`` (and
  something is running, whose completion will free blocks) no prefill phase is
  entered, so no step is spent on an admission that must fail;
* reactive: a prefill step that could not admit anything nor compute a prompt
  chunk (the engine had no blocks) ends the prefill phase, and the machine does
  not re-enter it until a running request has finished. This covers engines that
  leave ``head_fits`` at its default and estimates that were too optimistic.

Without either, a prefill phase under KV pressure alternates with empty steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ebplus.controller.messages import Mode, StepKind, ThresholdUpdate


@dataclass(frozen=True, slots=True)
class EngineView:
    """The engine state the machine decides on, read just before a step.

    Attributes:
        running: requests holding a slot (decoding, or with prompt chunks left).
        prefilling: of ``running``, those whose prompt is not fully computed yet.
        waiting: queued requests not holding a slot (preempted ones included).
        head_fits: whether the KV cache can take the next waiting request now;
            ``True`` when unknown (the reactive back-off still applies).
        now: seconds on a clock the replicas of a fleet share (the simulator's time, the
            scheduler's wall clock); ``None``: no clock, so no timed (staggered) windows.
    """

    running: int
    prefilling: int
    waiting: int
    head_fits: bool = True
    now: float | None = None

    @property
    def decoding(self) -> int:
        return self.running - self.prefilling


@dataclass(frozen=True, slots=True)
class StepPlan:
    """What the next step may schedule.

    Attributes:
        phase: the kind of step intended.
        decode: schedule the running requests that are decoding.
        prefill: schedule prompt chunks (running partial prefills, then admissions).
        max_admit: how many waiting requests may start this step.
        max_tokens: a token budget below the engine's for this step (0: none).
    """

    phase: StepKind
    decode: bool
    prefill: bool
    max_admit: int
    max_tokens: int = 0  # tokens the step may schedule (0: the engine's budget)


@dataclass
class PhaseStats:
    """Counters the exporter turns into metrics (never reset; exporters take deltas)."""

    steps: dict[StepKind, int] = field(default_factory=lambda: dict.fromkeys(StepKind, 0))
    phase_switches: int = 0
    prefill_phases: int = 0
    kv_backoffs: int = 0
    stagger_windows: int = 0  # windows opened by the stagger's timer rather than by k


class PhaseMachine:
    """Decides each step's phase under the current :class:`ThresholdUpdate`.

    Not thread-safe: the engine's scheduler loop owns it. ``apply`` may be called
    between any two steps; the new values govern the next ``decide``.
    """

    def __init__(self, thresholds: ThresholdUpdate) -> None:
        self.thresholds = thresholds
        self.phase = StepKind.DECODE  # the EB phase; MB steps do not change it
        self.stats = PhaseStats()
        self._blocked_at: int | None = None  # running count when admission last failed
        self._last: StepPlan | None = None
        self._refilled_to: int | None = None  # running count when the last EB prefill phase ended
        self._prefill_run = 0  # prefill steps in a row in the current phase (the prefill_steps bound)
        self._opened_at = -math.inf  # clock time the last EB window opened (the stagger's slots count from it)

    def apply(self, update: ThresholdUpdate) -> None:
        """Install new thresholds; they govern the next :meth:`decide`."""
        self.thresholds = update

    def decide(self, view: EngineView) -> StepPlan:
        """Plan the next step from the engine's current state."""
        th = self.thresholds
        room = max(0, th.n - view.running)
        if self._blocked_at is not None and (view.running < self._blocked_at or view.running == 0):
            self._blocked_at = None  # a request finished: KV may fit a new one now
        blocked = self._blocked_at is not None
        after_prefill = self._last is not None and self._last.phase is StepKind.PREFILL and not self._last.decode
        if th.active is Mode.MB and after_prefill and view.decoding > 0:
            # EB -> MB right after an exclusive prefill step: the decoders' token first. A mixed step
            # straight after it would make them wait for both steps, past the stall EB's bound allows.
            plan = StepPlan(StepKind.DECODE, decode=True, prefill=False, max_admit=0)
        elif th.active is Mode.MB:
            self._refilled_to = None
            plan = self._mixed(view, 0 if blocked else room)
        else:
            kv_short = not view.head_fits and view.running > 0  # a completion will free blocks
            plan = self._exclusive(view, room, blocked or kv_short, th)
        self.stats.steps[plan.phase] += 1
        self._last = plan
        return plan

    def _mixed(self, view: EngineView, room: int) -> StepPlan:
        can_prefill = view.prefilling > 0 or (view.waiting > 0 and room > 0)
        if view.decoding > 0 and can_prefill:
            phase = StepKind.MIXED
        elif view.decoding > 0:
            phase = StepKind.DECODE
        elif can_prefill:
            phase = StepKind.PREFILL
        else:
            phase = StepKind.IDLE
        return StepPlan(phase, decode=True, prefill=True, max_admit=room)

    def freed(self, running: int) -> int:
        """Slots freed since the last EB prefill phase ended (with ``running`` now): once ``k`` have, fewer
        than ``k`` waiting requests open a window too. Routers read it off a replica's phase board."""
        return 0 if self._refilled_to is None else self._refilled_to - running

    def last_slot(self, now: float) -> float | None:
        """The latest stagger slot at or before ``now`` (``None``: no stagger)."""
        period, phase = self.thresholds.stagger_period_s, self.thresholds.stagger_phase
        if period <= 0:
            return None
        return (math.floor(now / period - phase) + phase) * period

    def next_slot(self, now: float) -> float | None:
        """When the stagger's timer next opens a window if requests wait (``None``: no stagger). The
        simulator stops a run of identical decode steps there; routers may book it."""
        last = self.last_slot(now)
        if last is None:
            return None
        return now if last > self._opened_at else last + self.thresholds.stagger_period_s

    def _slot_due(self, view: EngineView) -> bool:
        last = None if view.now is None else self.last_slot(view.now)
        return last is not None and last > self._opened_at

    def _exclusive(self, view: EngineView, room: int, blocked: bool, th: ThresholdUpdate) -> StepPlan:
        k, bound = th.effective_k, th.prefill_steps
        admissible = 0 if blocked else min(view.waiting, room)
        freed = self.freed(view.running)
        if self.phase is StepKind.PREFILL:
            if view.prefilling == 0 and admissible == 0:
                self._switch(StepKind.DECODE)
                self._refilled_to = view.running
        elif view.prefilling > 0 or admissible >= k or (admissible > 0 and (view.decoding == 0 or freed >= k)):
            self._open(view)
        elif admissible > 0 and self._slot_due(view):
            self._open(view)
            self.stats.stagger_windows += 1
        if self.phase is StepKind.PREFILL:
            if 0 < bound <= self._prefill_run and view.decoding > 0:
                self._prefill_run = 0  # the decoders' token, then the phase goes on
                return StepPlan(StepKind.DECODE, decode=True, prefill=False, max_admit=0)
            self._prefill_run += 1
            return StepPlan(
                StepKind.PREFILL, decode=False, prefill=True, max_admit=admissible, max_tokens=th.prefill_tokens
            )
        if view.decoding > 0:
            return StepPlan(StepKind.DECODE, decode=True, prefill=False, max_admit=0)
        return StepPlan(StepKind.IDLE, decode=False, prefill=False, max_admit=0)

    def _open(self, view: EngineView) -> None:
        self._switch(StepKind.PREFILL)
        self.stats.prefill_phases += 1
        self._prefill_run = 0
        if view.now is not None:
            self._opened_at = view.now

    def _switch(self, phase: StepKind) -> None:
        if phase is not self.phase:
            self.phase = phase
            self.stats.phase_switches += 1

    def observe(self, admitted: int, prefill_tokens: int, running_after: int) -> None:
        """Feedback after the step ran: requests started, prompt tokens computed, running count.

        An exclusive prefill step that computed nothing hit a KV shortage (the
        engine could not allocate blocks for any waiting request): end the phase
        and do not re-enter it until a running request finishes. MB steps need no
        back-off because they always carry the decodes.
        """
        plan = self._last
        if plan is None or plan.phase is not StepKind.PREFILL or plan.decode:
            return
        if admitted == 0 and prefill_tokens == 0:
            self._blocked_at = running_after
            self.stats.kv_backoffs += 1
            self._switch(StepKind.DECODE)
            self._refilled_to = running_after
