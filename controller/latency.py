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


def prefill_bound(
    cost: CostModel, k: int, n: int, mu_l: float, budget: float | None, slo: SloConfig, cycle_s: float = 0.0
) -> int:
    """The longest prefill run (steps) whose stall meets the stall and ITL targets; 0: no bound needed.

    At least 1: a single prefill step is the least an exclusive phase can do (the step
    budget bounds it further).
    """
    targets = [t for t in (slo.max_stall_s, slo.itl_p99_s) if t is not None]
    if not targets:
        return 0
    steps, t_p = _prefill_phase(cost, k, mu_l, budget)
    t_d = cost.alpha_d + cost.beta_d * max(n - k / 2, 1.0)
    room = min(targets) - t_d - cycle_s
    fit = max(1, math.floor(room / t_p)) if room > 0 else 1
    return 0 if fit >= steps else fit


def eb_latency(
    k: int,
    n: int,
    cost: CostModel,
    mu_l: float,
    mu_o: float,
    budget: float | None,
    cycle_s: float = 0.0,
    bound: int = 0,
    queue: float = 0.0,
) -> Latency:
    """EB(k)'s latency at batch ``n`` (``cost`` folded; ``queue``: requests waiting beyond the batch)."""
    steps, t_p = _prefill_phase(cost, k, mu_l, budget)
    run = steps if bound <= 0 else min(bound, steps)
    runs = math.ceil(steps / run)
    t_d = cost.alpha_d + cost.beta_d * max(n - k / 2, 1.0)
    decode_steps = max(1.0, -max(mu_o - 1.0, 1e-9) * math.log1p(-min(k, n - 1) / n))
    stall = run * t_p + t_d + max(cycle_s, 0.0)
    itl = stall if runs / (decode_steps + runs) >= TAIL else t_d
    phase = steps * t_p + (runs - 1) * t_d
    tp = theory.tp_eb(k, n, cost.alpha_p, cost.alpha_d, cost.beta_p, cost.beta_d, mu_l, mu_o, budget, cycle_s)
    ttft = (1.0 - TAIL) * decode_steps * t_d + phase + max(cycle_s, 0.0) + queue / tp
    return Latency(ttft_p99=ttft, itl_p99=itl, stall=stall)


def mb_latency(n: int, cost: CostModel, mu_l: float, mu_o: float, budget: float | None, queue: float = 0.0) -> Latency:
    """MB's latency with ``n`` running requests (``cost`` folded)."""
    mb = theory.mb_steps(n, cost.alpha_mixed, cost.beta_mb, cost.alpha_d, cost.beta_d, mu_l, mu_o, budget)
    itl = mb.mixed_s if mb.share >= TAIL else mb.decode_s
    ttft = (mb.prefill_steps + 1.0) * mb.mixed_s + queue / mb.tp
    return Latency(ttft_p99=ttft, itl_p99=itl, stall=max(mb.mixed_s, mb.decode_s))


@dataclass(frozen=True)
class KChoice:
    """The threshold a plan applies, and why."""

    k: int
    k_throughput: int  # the throughput-optimal threshold it started from (theta x N)
    prefill_steps: int  # the prefill-run bound that goes with it (0: none)
    throughput: float  # predicted requests/s at k
    best_throughput: float  # the best over the candidates
    latency: Latency
    meets: bool | None  # the SLO targets at k (None: no targets)
    reason: str


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
) -> KChoice:
    """Pick k by the rule of the module docstring (``cost`` folded, ``cycle_s`` the measured per-cycle cost)."""
    if n < 2:
        raise ValueError(f"n must be >= 2, got {n}")
    k_star = min(max(1, k_star), n - 1)
    grid = np.unique(np.round(np.geomspace(1, n - 1, min(CANDIDATES, n - 1))).astype(int))
    ks = sorted({int(k) for k in grid} | {k_star})
    args = (cost.alpha_p, cost.alpha_d, cost.beta_p, cost.beta_d, mu_l, mu_o, budget, cycle_s)
    tps = {k: theory.tp_eb(k, n, *args) for k in ks}
    best = max(tps.values())
    tolerated = [k for k in ks if tps[k] >= (1.0 - slo.tolerance) * best]

    def judged(k: int) -> tuple[Latency, int, float | None]:
        bound = prefill_bound(cost, k, n, mu_l, budget, slo, cycle_s)
        lat = eb_latency(k, n, cost, mu_l, mu_o, budget, cycle_s, bound, queue)
        return lat, bound, lat.margin(slo)

    if not slo.targets:
        k = min(tolerated)
        why = f"k {k}: the smallest stall within {slo.tolerance:.0%} of the best predicted throughput (k* {k_star})"
    else:
        margins = {k: judged(k)[2] for k in ks}
        meeting = [k for k in tolerated if margins[k] >= 0]
        if meeting:
            k = max(meeting, key=lambda k: (margins[k], -k))
            why = f"k {k}: meets the latency targets with the most margin ({margins[k]:.0%}) within {slo.tolerance:.0%}"
        elif any(m >= 0 for m in margins.values()):
            k = max((k for k in ks if margins[k] >= 0), key=lambda k: tps[k])
            why = f"k {k}: the best throughput that meets the latency targets ({tps[k] / best:.1%} of the best)"
        else:
            k = max(tolerated, key=lambda k: margins[k])
            why = f"k {k}: no k meets the latency targets; the closest within {slo.tolerance:.0%} ({margins[k]:.0%})"
    lat, bound, margin = judged(k)
    return KChoice(
        k=k,
        k_throughput=k_star,
        prefill_steps=bound,
        throughput=tps[k],
        best_throughput=best,
        latency=lat,
        meets=None if margin is None else margin >= 0,
        reason=why,
    )
