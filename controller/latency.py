"""Latency of each mode from the closed forms, and the latency-aware choice of k.

Throughput is flat in EB's threshold over a wide range (H200, paper workload,
c = 1024: k = 10..200 within 0.5%), latency is not: a larger k means longer decode
phases to wait through before a prompt is admitted (TTFT) and longer prefill
phases during which every running request stalls (the inter-token latency's tail).
So k is picked in two steps: the k whose predicted throughput is within
``tolerance`` of the best (the closed forms' optimum is flat), then, among those,
the one that meets the latency targets with the most margin - with no targets, the
smallest stall. All predictions are steady-state step arithmetic, the same the
throughput forms rest on:

EB(k) at batch ``n``: a prefill phase computes ``k mu_L`` prompt tokens in
``s_p = ceil(k mu_L / B)`` steps (budget ``B``), split into runs of at most ``L``
steps (``prefill_steps``, the phase machine's bound) with a decode step between
runs; then ``D = -(mu_O - 1) ln(1 - k/n)`` decode steps of ``t_d`` each.

* stall: a decoder's longest gap, one prefill run plus a decode step (and the
  measured per-cycle cost);
* ITL p99: the stall when stalls are at least 1% of a decoder's gaps
  (``runs / (D + runs)``), else a decode step;
* TTFT p99: 99% of a decode phase (waiting for the next prefill phase), the
  prefill phase itself, and any queue in front of the batch.

MB: every step carries all decodes; a mixed step (prompt chunks) is its longest,
and its share of steps is ``mb_steps``'s; a prompt takes ``s_p`` mixed steps.
"""

from __future__ import annotations

import bisect
import functools
import math
from dataclasses import dataclass

import numpy as np

from ebplus.controller import theory
from ebplus.controller.config import SloConfig
from ebplus.controller.cost_model import CostModel

#: Share of a decoder's inter-token gaps above which its p99 is the stall.
TAIL = 0.01
#: Candidate thresholds evaluated per plan (log-spaced over [1, n-1], plus k*).
CANDIDATES = 48


@dataclass(frozen=True)
class Latency:
    """Predicted latency of one mode (seconds)."""

    ttft_p99: float
    itl_p99: float
    stall: float  # the longest gap between two tokens of a running request

    def margin(self, slo: SloConfig) -> float | None:
        """The smallest relative headroom ``(target - value) / target`` over the set targets; ``None`` without."""
        pairs = [(slo.ttft_p99_s, self.ttft_p99), (slo.itl_p99_s, self.itl_p99), (slo.max_stall_s, self.stall)]
        margins = [(t - v) / t for t, v in pairs if t is not None]
        return min(margins) if margins else None


def _prefill_phase(cost: CostModel, k: int, mu_l: float, budget: float | None) -> tuple[int, float]:
    """Steps of a prefill phase admitting ``k`` prompts, and the seconds of one of them."""
    tokens = k * mu_l
    steps = 1 if budget is None or tokens <= budget else math.ceil(tokens / budget)
    return steps, cost.alpha_p + cost.beta_p * tokens / steps


#: The smallest prefill step a stall target may ask for (tokens): below it the fixed cost dominates.
MIN_PREFILL_TOKENS = 256


@dataclass(frozen=True)
class PrefillBound:
    """How EB's prefill phases are cut so running requests do not stall past a target.

    ``steps``: prefill steps in a row before a decode step (0: unbounded); ``tokens``:
    prompt tokens a prefill step may carry (0: the engine's budget).
    """

    steps: int = 0
    tokens: int = 0

    def step_budget(self, budget: float | None) -> float | None:
        return float(self.tokens) if self.tokens else budget


#: The bound of a plan without stall or ITL targets (most plans): one shared object rather than one a candidate
#: ``k`` (~50 a plan) and one a replica's plan kept, each a young object the garbage collector walks.
UNBOUNDED = PrefillBound()


class Prices:
    """EB's and MB's closed-form prices (:func:`theory.tp_eb`, :func:`theory.mb_steps`) for one plan, each
    computed once per set of arguments.

    A plan prices EB at its operating point up to five times (the latency rule, the crossover, the per-token
    time as measured and as modelled, the capacity at the cap) and MB up to three, mostly with the same
    arguments (no measured per-cycle cost, the batch at its cap). Both are pure functions of their
    arguments, so an answer is reused only for the very same arguments; one book serves one plan (a new
    plan, a new book), so nothing in it can go stale.
    """

    def __init__(self) -> None:
        self._eb: dict[tuple, float] = {}
        self._mb: dict[tuple, theory.MixedSteps] = {}

    def tp_eb(self, k: int, n: int, alpha_p: float, alpha_d: float, beta_p: float, beta_d: float, mu_l: float,
              mu_o: float, budget: float | None = None, cycle_s: float = 0.0) -> float:  # fmt: skip
        """:func:`theory.tp_eb` of these arguments."""
        key = (k, n, alpha_p, alpha_d, beta_p, beta_d, mu_l, mu_o, budget, cycle_s)
        tp = self._eb.get(key)
        if tp is None:
            tp = self._eb[key] = theory.tp_eb(*key)
        return tp

    def priced_eb(self, tp: float, k: int, n: int, alpha_p: float, alpha_d: float, beta_p: float, beta_d: float,
                  mu_l: float, mu_o: float, budget: float | None, cycle_s: float) -> None:  # fmt: skip
        """Record ``tp``, what :func:`theory.tp_eb` returns for these arguments, priced by the caller
        (:func:`choose_k` prices its candidates with :func:`theory.tp_eb_many`: the same floats)."""
        self._eb[(k, n, alpha_p, alpha_d, beta_p, beta_d, mu_l, mu_o, budget, cycle_s)] = tp

    def mb_steps(self, n: int, alpha_mb: float, beta_mb_coeffs: tuple[float, float, float], alpha_d: float,
                 beta_d: float, mu_l: float, mu_o: float, budget: float | None = None) -> theory.MixedSteps:  # fmt: skip
        """:func:`theory.mb_steps` of these arguments."""
        key = (n, alpha_mb, beta_mb_coeffs, alpha_d, beta_d, mu_l, mu_o, budget)
        steps = self._mb.get(key)
        if steps is None:
            steps = self._mb[key] = theory.mb_steps(*key)
        return steps


def prefill_bound(
    cost: CostModel, k: int, n: int, mu_l: float, budget: float | None, slo: SloConfig, cycle_s: float = 0.0
) -> PrefillBound:
    """The longest prefill run that keeps the stall within the stall and ITL targets (none: unbounded).

    A prefill phase admits every request waiting when it starts (a burst, or a long
    decode phase under open-loop arrivals), so its length has a tail the mean does not
    show; the bound is what caps that tail. Runs of full-budget steps when one step
    fits the target; else one step of fewer tokens (at least ``MIN_PREFILL_TOKENS``).
    """
    targets = [t for t in (slo.max_stall_s, slo.itl_p99_s) if t is not None]
    if not targets:
        return UNBOUNDED
    t_d = cost.alpha_d + cost.beta_d * max(n - k / 2, 1.0)
    room = (1.0 - slo.safety) * min(targets) - t_d - max(cycle_s, 0.0)
    full = _full_step(cost, k, mu_l, budget)
    if room >= full:
        return PrefillBound(steps=max(1, math.floor(room / full)))
    fit = (room - cost.alpha_p) / cost.beta_p if cost.beta_p > 0 else math.inf
    return PrefillBound(steps=1, tokens=max(MIN_PREFILL_TOKENS, math.floor(fit)) if math.isfinite(fit) else 0)


def _full_step(cost: CostModel, k: int, mu_l: float, budget: float | None) -> float:
    """Seconds of the largest prefill step a phase may run: a full budget (or k prompts, unchunked)."""
    tokens = budget if budget is not None else k * mu_l
    return cost.alpha_p + cost.beta_p * tokens


def eb_latency(
    k: int,
    n: int,
    cost: CostModel,
    mu_l: float,
    mu_o: float,
    budget: float | None,
    cycle_s: float = 0.0,
    bound: PrefillBound | None = None,
    queue: float = 0.0,
    tp: float | None = None,
) -> Latency:
    """EB(k)'s latency at batch ``n`` (``cost`` folded; ``queue``: requests waiting beyond the batch).

    ``tp``: EB(k)'s throughput under these arguments, when the caller priced it already (:func:`choose_k`
    prices every candidate): it is what :func:`theory.tp_eb` would return here, so it is not priced twice.
    """
    bound = bound or UNBOUNDED
    step_budget = bound.step_budget(budget)
    steps, t_p = _prefill_phase(cost, k, mu_l, step_budget)
    run = steps if bound.steps <= 0 else min(bound.steps, steps)
    runs = math.ceil(steps / run)
    t_d = cost.alpha_d + cost.beta_d * max(n - k / 2, 1.0)
    decode_steps = max(1.0, -max(mu_o - 1.0, 1e-9) * math.log1p(-min(k, n - 1) / n))
    # the tail: a bounded run can be full steps; an unbounded one is the mean phase
    longest = bound.steps * _full_step(cost, k, mu_l, step_budget) if bound.steps > 0 else run * t_p
    stall = longest + t_d + max(cycle_s, 0.0)
    itl = stall if runs / (decode_steps + runs) >= TAIL else t_d
    phase = steps * t_p + (runs - 1) * t_d
    if tp is None:
        tp = theory.tp_eb(k, n, cost.alpha_p, cost.alpha_d, cost.beta_p, cost.beta_d, mu_l, mu_o, step_budget, cycle_s)
    ttft = (1.0 - TAIL) * decode_steps * t_d + phase + max(cycle_s, 0.0) + queue / tp
    return Latency(ttft_p99=ttft, itl_p99=itl, stall=stall)


def mb_latency(
    n: int, cost: CostModel, mu_l: float, mu_o: float, budget: float | None, queue: float = 0.0,
    prices: Prices | None = None,
) -> Latency:  # fmt: skip
    """MB's latency with ``n`` running requests (``cost`` folded; ``prices``: the plan's, if any)."""
    mb_steps = theory.mb_steps if prices is None else prices.mb_steps
    mb = mb_steps(n, cost.alpha_mixed, cost.beta_mb, cost.alpha_d, cost.beta_d, mu_l, mu_o, budget)
    itl = mb.mixed_s if mb.share >= TAIL else mb.decode_s
    ttft = (mb.prefill_steps + 1.0) * mb.mixed_s + queue / mb.tp
    return Latency(ttft_p99=ttft, itl_p99=itl, stall=max(mb.mixed_s, mb.decode_s))


@dataclass(frozen=True)
class KChoice:
    """The threshold a plan applies, and why."""

    k: int
    k_throughput: int  # the throughput-optimal threshold it started from (theta x N)
    bound: PrefillBound  # how prefill phases are cut for the stall target
    throughput: float  # predicted requests/s at k
    best_throughput: float  # the best over the candidates
    latency: Latency
    meets: bool | None  # the SLO targets at k, with the safety margin (None: no targets)
    reason: str


@functools.lru_cache(maxsize=4096)
def _grid(n: int) -> tuple[int, ...]:
    """The log-spaced candidate thresholds for a batch of ``n`` (the same for every plan at that ``n``), ascending."""
    return tuple(int(k) for k in np.unique(np.round(np.geomspace(1, n - 1, min(CANDIDATES, n - 1))).astype(int)))


def _candidates(n: int, k_star: int) -> list[int]:
    """``sorted({*_grid(n), k_star})``: the grid is sorted and unique, so ``k_star`` is inserted in its place."""
    grid = _grid(n)
    at = bisect.bisect_left(grid, k_star)
    if at < len(grid) and grid[at] == k_star:
        return list(grid)
    return [*grid[:at], k_star, *grid[at:]]


def choose_k(
    k_star: int,
    n: int,
    cost: CostModel,
    mu_l: float,
    mu_o: float,
    budget: float | None,
    slo: SloConfig,
    cycle_s: float = 0.0,
    queue: float = 0.0,
    prices: Prices | None = None,
) -> KChoice:
    """Pick k by the rule of the module docstring (``cost`` folded, ``cycle_s`` the measured per-cycle cost).

    ``prices``: the plan's price book, given the chosen k's throughput (the plan prices EB there again).
    """
    if n < 2:
        raise ValueError(f"n must be >= 2, got {n}")
    k_star = min(max(1, k_star), n - 1)
    ks = _candidates(n, k_star)
    base = (cost.alpha_p, cost.alpha_d, cost.beta_p, cost.beta_d, mu_l, mu_o)
    if slo.max_stall_s is None and slo.itl_p99_s is None:  # no stall target: every k unbounded (prefill_bound's answer)
        bounds = [UNBOUNDED] * len(ks)
        budgets = [UNBOUNDED.step_budget(budget)] * len(ks)
    else:
        bounds = [prefill_bound(cost, k, n, mu_l, budget, slo, cycle_s) for k in ks]
        budgets = [bound.step_budget(budget) for bound in bounds]
    tp_list = theory.tp_eb_many(ks, n, *base, budgets, cycle_s)
    best = max(tp_list)
    floor = (1.0 - slo.tolerance) * best
    if not slo.targets:  # most plans: the smallest k within the tolerance (ks ascend), judged alone
        at = next((i for i, tp in enumerate(tp_list) if tp >= floor), None)
        if at is None:  # (no throughput is a number: what min() of the empty choice raised)
            raise ValueError("min() arg is an empty sequence")
        k, tp, bound = ks[at], tp_list[at], bounds[at]
        lat = eb_latency(k, n, cost, mu_l, mu_o, budget, cycle_s, bound, queue, tp=tp)
        margin = lat.margin(slo)
        why = f"k {k}: the smallest stall within {slo.tolerance:.0%} of the best predicted throughput (k* {k_star})"
    else:
        k, tp, bound, lat, margin, why = _by_targets(ks, tp_list, bounds, best, floor, n, cost, mu_l, mu_o, budget,
                                                     slo, cycle_s, queue)  # fmt: skip
    if prices is not None:
        prices.priced_eb(tp, k, n, *base, bound.step_budget(budget), cycle_s)
    return KChoice(
        k=k,
        k_throughput=k_star,
        bound=bound,
        throughput=tp,
        best_throughput=best,
        latency=lat,
        meets=None if margin is None else margin >= slo.safety,
        reason=why,
    )


def _by_targets(
    ks: list[int],
    tp_list: list[float],
    bounds: list[PrefillBound],
    best: float,
    floor: float,
    n: int,
    cost: CostModel,
    mu_l: float,
    mu_o: float,
    budget: float | None,
    slo: SloConfig,
    cycle_s: float,
    queue: float,
) -> tuple[int, float, PrefillBound, Latency, float | None, str]:
    """:func:`choose_k`'s pick with latency targets: every candidate's margin, then the rule's choice among them;
    ``(k, its throughput, its bound, its latency, its margin, why)``."""
    tps = dict(zip(ks, tp_list, strict=True))
    bound_of = dict(zip(ks, bounds, strict=True))
    lats = {k: eb_latency(k, n, cost, mu_l, mu_o, budget, cycle_s, bound_of[k], queue, tp=tps[k]) for k in ks}
    margins = {k: lat.margin(slo) for k, lat in lats.items()}
    tolerated = [k for k in ks if tps[k] >= floor]
    meeting = [k for k in tolerated if margins[k] >= slo.safety]
    if meeting:
        k = max(meeting, key=lambda k: (margins[k], -k))
        why = f"k {k}: meets the latency targets with the most margin ({margins[k]:.0%}) within {slo.tolerance:.0%}"
    elif any(m >= slo.safety for m in margins.values()):
        k = max((k for k in ks if margins[k] >= slo.safety), key=lambda k: tps[k])
        why = f"k {k}: the best throughput that meets the latency targets ({tps[k] / best:.1%} of the best)"
    else:
        k = max(tolerated, key=lambda k: margins[k])
        why = f"k {k}: no k meets the latency targets; the closest within {slo.tolerance:.0%} ({margins[k]:.0%})"
    return k, tps[k], bound_of[k], lats[k], margins[k], why
