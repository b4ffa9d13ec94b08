"""What each mode really delivers on a replica, against what the cost model predicts for it.

The EB/MB choice compares two predictions of the closed forms. Those rest on a
linear step-cost model fitted with Huber weights, and some real costs never show in
such a model: a stall when an engine switches between prefill and decode phases
(paid once a phase, so the robust fit sees it as an outlier and discounts it), a
mixed-step cost curve that is not quadratic in the decode share. Either can make the
model prefer the slower mode, and nothing in the open loop would notice.

:class:`ModeEvidence` closes the loop. It keeps, per mode, the steps a replica ran
while it was known to run that mode (see ``FleetController``: steps are attributed
only once the replica reports the switch applied, and the batch that straddles a
switch is dropped). At each plan the steps are priced with the *current* cost model
and compared with their measured seconds::

    bias(mode) = sum(measured seconds) / sum(model seconds)     over that mode's recent steps

A bias of 1.0 means the model prices that mode's steps right; 1.15 means the mode
really takes 15% longer than predicted, whatever the cause. The planner multiplies
MB's predicted seconds per token by its bias before comparing the modes. EB's excess
is charged per prefill phase instead (``excess_per_phase``): a cost paid once a cycle
weighs less as k grows, so charging it per cycle also moves EB's threshold (theta*
sees it as part of the phase's fixed cost) where a flat factor could not. Why
step-level and not requests/s: the ratio compares the same steps, so it needs no
"comparable load" (a mode measured at another concurrency still says how far the
model is off for it), and it is not distorted by where an EB cycle starts or ends
inside a measuring window (a window holding one more prefill phase than decode
phases would read as 2x faster in tokens/s).

A mode that has never run on this replica has no evidence; the planner may explore
it (``PlannerConfig.explore_below``). Evidence measured at another operating point
(concurrency, or the workload's mean lengths, off by more than ``explore_reset``)
is still used but counts as stale, so a changed load may be explored again.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ebplus.controller.cost_model import CostModel, price_steps
from ebplus.controller.latency import Latency
from ebplus.controller.messages import CompletionRecord, Mode, StepRecord

#: Columns of a ledger row: prefill tokens, decode tokens, KV read, seconds, running, starts a prefill phase.
_COLUMNS = 6


def _median_of(values: tuple[float, ...]) -> float:
    """``statistics.median`` of a few values, its arithmetic without its generality (two a measurement)."""
    ordered = sorted(values)
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2


@dataclass(frozen=True)
class OperatingPoint:
    """Where a mode was measured: mean running requests and the workload's mean lengths."""

    running: float
    mu_l: float
    mu_o: float

    def near(self, other: OperatingPoint, factor: float) -> bool:
        """Every coordinate within ``factor`` x of ``other``'s (coordinates not > 0 on both sides are not compared)."""
        for a, b in ((self.running, other.running), (self.mu_l, other.mu_l), (self.mu_o, other.mu_o)):
            if a > 0 and b > 0 and not a / factor <= b <= a * factor:
                return False
        return True


@dataclass(frozen=True)
class ModeMeasurement:
    """One mode's recent steps on a replica, measured and as the cost model prices them."""

    mode: Mode
    steps: int
    seconds: float  # measured
    model_seconds: float  # the same steps priced by the current cost model
    tokens: int  # prefill + decode tokens the steps computed
    running: float  # time-weighted mean of running requests over the steps
    plan: int  # the planner's plan count when the last of these steps arrived
    point: OperatingPoint  # where they were measured (mean lengths 0: before any estimate)
    phases: int = 0  # prefill phases the steps hold (EB's cycles)

    @property
    def excess_per_phase(self) -> float:
        """Measured minus model seconds per prefill phase: EB's cost beyond its steps (e.g. switching)."""
        return (self.seconds - self.model_seconds) / self.phases if self.phases else 0.0

    @property
    def bias(self) -> float:
        """Measured over predicted time of these steps: > 1 means the mode is slower than modelled."""
        return self.seconds / self.model_seconds if self.model_seconds > 0 else 1.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def model_tokens_per_s(self) -> float:
        return self.tokens / self.model_seconds if self.model_seconds > 0 else 0.0


@dataclass(frozen=True)
class ModeWork:
    """What a replica's engine computed while it ran one mode, ever (the ``ebplus_mode_*_total`` counters)."""

    tokens: int  # prefill + decode tokens of its steps
    seconds: float  # measured seconds of those steps


class _Ledger:
    """A bounded ring of one mode's steps, as a numpy array so pricing them is one vector pass.

    The ring is stored a column a row (``columns``, shape ``(columns, capacity)``): a plan sums
    whole columns of it, and a contiguous column sums in a third of the time a strided one
    takes, to the same float (numpy's pairwise summation does not depend on the stride).

    Each row's price under a cost model is kept beside it (:meth:`model_seconds`): between two
    plans a replica's ring gains a push or two of steps and its cost model seldom changes (a
    refit), so a plan prices the new rows only, not all of them.
    """

    def __init__(self, capacity: int) -> None:
        self.columns = np.zeros((_COLUMNS, capacity))
        self._priced = np.zeros(capacity)  # each row's seconds under _priced_for
        # rows written since they were last priced: always the newest, the `_fresh` rows before `head`
        # (each add writes the ring on from `head`), so no per-row mark is needed to find them
        self._fresh = 0
        self._priced_for: CostModel | None = None
        self.size = 0
        self.head = 0
        self.plan = 0
        self.total = 0  # steps ever added (the ring keeps the newest)
        self.tokens_total = 0  # their tokens and seconds, ever
        self.seconds_total = 0.0
        self.phases = 0  # prefill phases ever started
        self.in_prefill = False
        self.lengths: list[tuple[float, float]] = []  # (mu_l, mu_o) of the estimates the steps ran under
        # the last measure() of this ledger and the cost model it priced with: a plan measures both modes'
        # ledgers, and a replica adds steps to the one of the mode it runs, so the other's answer is kept
        self.measured: tuple[CostModel, ModeMeasurement | None] | None = None

    @property
    def rows(self) -> np.ndarray:
        """The ring a step a row, ``(capacity, columns)``: a view of :attr:`columns`."""
        return self.columns.T

    def add(self, records: Iterable[StepRecord]) -> int:
        """Append the steps that computed something, in order; one array write per call (a telemetry batch)."""
        rows = [(r.prefill_tokens, r.decode_tokens, r.kv_tokens, r.seconds, r.running, 0) for r in records
                if r.prefill_tokens + r.decode_tokens > 0]  # fmt: skip
        if not rows:
            return 0
        self.measured = None
        block = np.array(rows, dtype=float)
        prefill_only = block[:, 1] == 0
        before = np.concatenate([[self.in_prefill], prefill_only[:-1]])
        starts = prefill_only & ~before  # a prefill phase starts (EB's cycle; MB has none)
        block[:, 5] = starts
        self.phases += int(starts.sum())
        self.in_prefill = bool(prefill_only[-1])
        cap, n = self.columns.shape[1], len(rows)
        last = block[-cap:]  # what a row-by-row ring would still hold of them
        at = (self.head + n - len(last)) % cap
        first = min(len(last), cap - at)
        self.columns[:, at : at + first] = last[:first].T
        self.columns[:, : len(last) - first] = last[first:].T
        self._fresh = min(cap, self._fresh + len(last))
        self.head = (self.head + n) % cap
        self.size = min(self.size + n, cap)
        self.total += n
        self.tokens_total += int(block[:, 0].sum() + block[:, 1].sum())
        self.seconds_total += float(block[:, 3].sum())
        return n

    def view(self) -> np.ndarray:
        """The held steps a row each, ``(size, columns)`` (a view)."""
        return self.columns[:, : self.size].T

    def held(self) -> np.ndarray:
        """The held steps a column each, ``(columns, size)``: each column contiguous (a view)."""
        return self.columns[:, : self.size]

    def model_seconds(self, cost: CostModel) -> np.ndarray:
        """Each held step's seconds under ``cost`` (:meth:`CostModel.steps_seconds`), in :meth:`view`'s order."""
        for a, b in self.unpriced(cost):
            cols = self.columns[:, a:b]
            self._priced[a:b] = cost.steps_seconds(cols[0], cols[1], cols[2])
        self.priced(cost)
        return self._priced[: self.size]

    def unpriced(self, cost: CostModel) -> list[tuple[int, int]]:
        """The ranges of rows whose price under ``cost`` is not held: the newest ``_fresh`` rows (all of them
        under another model), which end at head and wrap round the ring's end at most once."""
        fresh = self.size if cost is not self._priced_for else self._fresh
        if not fresh:
            return []
        cap, lo = self.columns.shape[1], self.head - fresh
        spans = [(lo, self.head)] if lo >= 0 else [(cap + lo, cap), (0, self.head)]
        return [(a, b) for a, b in spans if b > a]

    def priced(self, cost: CostModel) -> None:
        """The caller wrote the prices of :meth:`unpriced`'s rows under ``cost`` (a step's price is an
        elementwise function of its row: the same float whatever else was priced in the same pass)."""
        self._priced_for, self._fresh = cost, 0


@dataclass(frozen=True)
class LatencyMeasurement:
    """The latency requests saw while a mode ran (p99 over its recent completions)."""

    completions: int
    ttft_p99: float
    stall_p99: float  # of each request's longest wait between two tokens


class _LatencyRing:
    """A bounded ring of (ttft, stall) of one mode's recent completions."""

    def __init__(self, capacity: int) -> None:
        self.rows = np.zeros((capacity, 2))
        self.size = 0
        self.head = 0

    def add(self, records: Iterable[CompletionRecord]) -> None:
        cap = self.rows.shape[0]
        for rec in records:
            if rec.ttft_s <= 0 or rec.output_len < 1:
                continue  # not measured by this engine
            self.rows[self.head] = (rec.ttft_s, rec.stall_s)
            self.head = (self.head + 1) % cap
            self.size = min(self.size + 1, cap)


class ModeEvidence:
    """Per-mode step ledgers of one replica (see the module docstring).

    Args:
        window: steps kept per mode; the newest replace the oldest.
        min_steps: a mode's evidence counts once it holds this many steps...
        min_phases: ...and, for EB, this many prefill phases: costs paid once a phase
            (switching) must be in the sample in their true proportion, not by chance.
    """

    def __init__(
        self, window: int = 4096, min_steps: int = 32, min_phases: int = 4, latency_window: int = 1000,
        min_completions: int = 100,
    ) -> None:  # fmt: skip
        if window < 1 or min_steps < 1 or min_phases < 0 or latency_window < 1 or min_completions < 1:
            raise ValueError("window, min_steps, latency_window and min_completions must be >= 1, min_phases >= 0")
        self.window = window
        self.min_steps = min_steps
        self.min_phases = min_phases
        self.latency_window = latency_window
        self.min_completions = min_completions
        self._ledgers: dict[Mode, _Ledger] = {}
        self._latency: dict[Mode, _LatencyRing] = {}

    def observe_completions(self, mode: Mode, records: Iterable[CompletionRecord]) -> None:
        """Add the latency of requests that finished while ``mode`` ran (those the engine measured)."""
        ring = self._latency.get(mode)
        if ring is None:
            ring = self._latency[mode] = _LatencyRing(self.latency_window)
        ring.add(records)

    def latency(self, mode: Mode) -> LatencyMeasurement | None:
        """p99 TTFT and stall of the mode's recent completions; ``None`` below ``min_completions``."""
        ring = self._latency.get(mode)
        if ring is None or ring.size < self.min_completions:
            return None
        ttft, stall = np.percentile(ring.rows[: ring.size], 99, axis=0)
        return LatencyMeasurement(ring.size, float(ttft), float(stall))

    def observe(
        self, mode: Mode, records: Iterable[StepRecord], plan: int, lengths: tuple[float, float] | None = None
    ) -> None:
        """Add steps run in ``mode`` (EB or MB) during the planner's ``plan``-th interval,
        under a workload estimate of mean lengths ``lengths = (mu_l, mu_o)`` (``None``: none yet)."""
        if mode not in (Mode.EB, Mode.MB):
            raise ValueError(f"evidence is kept for eb and mb, not {mode.value}")
        ledger = self._ledgers.get(mode)
        if ledger is None:
            ledger = self._ledgers[mode] = _Ledger(self.window)
        if ledger.add(records):
            ledger.plan = plan
            if lengths is not None:
                ledger.lengths = [*ledger.lengths[-7:], lengths]

    def mark(self, mode: Mode) -> tuple[int, int]:
        """Steps and prefill phases of ``mode`` ever observed: pass to :meth:`enough_since`."""
        ledger = self._ledgers.get(mode)
        return (0, 0) if ledger is None else (ledger.total, ledger.phases)

    def work(self) -> dict[Mode, ModeWork]:
        """Tokens and step seconds each observed mode computed, ever (not only the window's)."""
        return {mode: ModeWork(ledger.tokens_total, ledger.seconds_total) for mode, ledger in self._ledgers.items()}

    def enough_since(self, mode: Mode, mark: tuple[int, int]) -> bool:
        """Whether ``mode`` gained a full sample (``min_steps``, and for EB ``min_phases``) since ``mark``."""
        steps, phases = self.mark(mode)
        return steps - mark[0] >= self.min_steps and (mode is not Mode.EB or phases - mark[1] >= self.min_phases)

    def measure(self, mode: Mode, cost: CostModel) -> ModeMeasurement | None:
        """The mode's evidence priced with ``cost``; ``None`` until it holds a full sample."""
        ledger = self._ledgers.get(mode)
        if ledger is None:
            return None
        if ledger.measured is not None and ledger.measured[0] is cost:
            return ledger.measured[1]
        measured = self._measure(mode, ledger, cost)
        ledger.measured = (cost, measured)
        return measured

    def _measure(self, mode: Mode, ledger: _Ledger, cost: CostModel) -> ModeMeasurement | None:
        prefill, decode, _, seconds, running, starts = ledger.held()
        # sums by np.add.reduce, what ndarray.sum calls, without its Python wrapper (five a measurement)
        total_of = np.add.reduce
        # a full sample: min_steps steps and, for EB, min_phases prefill phases among them
        phases = int(total_of(starts))
        if ledger.size < self.min_steps or (mode is Mode.EB and phases < self.min_phases):
            return None
        model = ledger.model_seconds(cost)
        total = float(total_of(seconds))
        # np.average's and np.median's arithmetic, without their overhead (a plan prices two ledgers)
        mean_running = float(total_of(running * seconds) / total) if total > 0 else 0.0
        mu_l, mu_o = (0.0, 0.0)
        if ledger.lengths:
            mu_l, mu_o = (_median_of(column) for column in zip(*ledger.lengths, strict=True))
        point = OperatingPoint(running=mean_running, mu_l=float(mu_l), mu_o=float(mu_o))
        return ModeMeasurement(
            mode=mode,
            steps=ledger.size,
            seconds=total,
            model_seconds=float(total_of(model)),
            tokens=int(total_of(prefill) + total_of(decode)),
            running=mean_running,
            plan=ledger.plan,
            point=point,
            phases=phases,
        )

    def measure_all(self, cost: CostModel) -> dict[Mode, ModeMeasurement]:
        out = {}
        for mode in (Mode.EB, Mode.MB):
            m = self.measure(mode, cost)
            if m is not None and math.isfinite(m.bias):
                out[mode] = m
        return out


@dataclass(frozen=True)
class ModeCheck:
    """One mode in a decision: the model's prediction and what measurement makes of it."""

    mode: Mode
    predicted: float  # the model's seconds per token at this plan's operating point
    bias: float  # measured / model time of the mode's recent steps; 1.0 when not measured
    corrected: float  # predicted x bias: what the decision compares
    measured: ModeMeasurement | None
    stale: bool = False  # measured at another operating point (see LoopConfig.explore_reset)
    latency: Latency | None = None  # what the targets are checked against; None without SLO targets
    meets: bool | None = None  # the SLO targets (None: no targets)
    latency_measured: LatencyMeasurement | None = None  # what the mode's requests saw, when it ran
    capacity: float = 0.0  # tokens/s with the batch at its cap (corrected)


@dataclass(frozen=True)
class Judgement:
    """Both modes as the decision saw them: ``margin = eb.corrected - mb.corrected`` (> 0 favours MB)."""

    eb: ModeCheck
    mb: ModeCheck
    margin: float
    exploring: Mode | None = None  # the mode being measured, during an exploration
    load: float | None = None  # tokens/s the replica computed since the previous plan

    @classmethod
    def of_checks(
        cls, eb: ModeCheck, mb: ModeCheck, exploring: Mode | None = None, load: float | None = None
    ) -> Judgement:
        return cls(eb=eb, mb=mb, margin=eb.corrected - mb.corrected, exploring=exploring, load=load)

    def of(self, mode: Mode) -> ModeCheck:
        return self.eb if mode is Mode.EB else self.mb


def price_fleet(books: Iterable[tuple[ModeEvidence, CostModel]]) -> None:
    """Price the steps each replica's ledgers gained since its last plan under its cost model, all replicas'
    in one vector pass (:func:`~ebplus.controller.cost_model.price_steps` with per-step coefficients).

    Between two fleet updates every replica pushes steps; priced one replica at a time (in
    :meth:`ModeEvidence.measure`) each pass is a few dozen rows and mostly numpy's per-call cost. The prices
    are the floats a replica's own pass gives (every operation is elementwise), and the ledgers then hold
    nothing unpriced under those models, so a plan measuring with the same model prices nothing again.
    """
    ledgers = [(ledger, cost) for evidence, cost in books for ledger in evidence._ledgers.values()]
    spans = [(ledger, a, b, cost) for ledger, cost in ledgers for a, b in ledger.unpriced(cost)]
    if spans:
        held = np.concatenate([ledger.columns[:3, a:b] for ledger, a, b, _ in spans], axis=1)
        counts = [b - a for _, a, b, _ in spans]
        per_model = np.array([cost.coefficients() for *_, cost in spans]).T  # a row per coefficient
        prices = price_steps(held[0], held[1], held[2], tuple(np.repeat(per_model, counts, axis=1)))
        at = 0
        for (ledger, a, b, _), count in zip(spans, counts, strict=True):
            ledger._priced[a:b] = prices[at : at + count]
            at += count
    for ledger, cost in ledgers:
        ledger.priced(cost)
