"""What a simulated run measured: :class:`SimResult` (and the optional per-step :class:`StepLog`).

Kept apart from the simulator so that benchmarks, plots and tests read results
without the engine model.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ebplus.controller.estimator import Estimate
from ebplus.controller.fleet import FleetController
from ebplus.controller.messages import Mode
from ebplus.simulator.latency import SloTargets, histogram_percentile, slo_report

if TYPE_CHECKING:  # the simulator imports this module
    from ebplus.simulator.sim import Simulator


@dataclass
class StepLog:
    """Per-step record kept when ``SimConfig.record_steps`` is set (plain lists, one entry per step)."""

    t_end: list[float] = field(default_factory=list)
    phase: list[str] = field(default_factory=list)
    prefill_tokens: list[int] = field(default_factory=list)
    decode_tokens: list[int] = field(default_factory=list)
    admitted: list[int] = field(default_factory=list)
    running: list[int] = field(default_factory=list)  # after the step
    waiting: list[int] = field(default_factory=list)  # after the step
    kv_used: list[int] = field(default_factory=list)  # after the step
    n_cap: list[int] = field(default_factory=list)  # thresholds.n during the step
    k: list[int] = field(default_factory=list)  # effective k during the step
    active: list[str] = field(default_factory=list)  # "mb" or "eb"


@dataclass
class SimResult:
    """What one run measured. ``as_json`` has the documented keys of ``ebplus sim run --json``.

    Keys (times in seconds of simulated time):

    * ``policy``, ``requests``, ``sim_seconds`` (first arrival to last completion);
    * throughput: ``req_per_s``, ``tok_per_s`` (input + output), ``out_tok_per_s``;
    * ``ttft_p50_s``/``ttft_p99_s`` (arrival to first token), ``tpot_p50_s``/``tpot_p99_s``
      (per request: (finish - first token) / (output - 1));
    * ``itl_p50_s``/``itl_p99_s``: inter-token latency, over every gap between two
      consecutive output tokens of a request (all requests' tokens pooled);
    * ``stall_p99_s``/``stall_max_s``: each request's largest gap, its p99 and max;
    * ``slo``: the targets (``ttft_s``, ``itl_s``, ``tpot_s``; null when none were given);
      ``ttft_attainment``/``itl_attainment``/``tpot_attainment``: fraction of requests
      meeting each target (null without it; ITL is met when the request's largest gap
      is within it); ``goodput_req_per_s``: requests meeting every target per second;
    * ``preemptions``, ``mode_switches``, ``k_final`` (null in MB), ``n_final``.
    """

    policy: str
    requests: int
    sim_seconds: float
    req_per_s: float
    tok_per_s: float
    out_tok_per_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p99_s: float
    itl_p50_s: float
    itl_p99_s: float
    stall_p99_s: float
    stall_max_s: float
    preemptions: int
    mode_switches: int
    k_final: int | None
    n_final: int
    steps: dict[str, int]
    prefill_tokens: int  # computed in prefill steps, recompute included
    decode_tokens: int
    recompute_tokens: int  # KV discarded by preemption and computed again
    max_kv_tokens: int
    max_running: int
    finish_s: np.ndarray  # per request, issue order
    arrival_s: np.ndarray
    first_token_s: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    stall_s: np.ndarray  # per request: its largest inter-token gap (0 with one output token)
    itl_hist: np.ndarray  # every inter-token gap, binned (ebplus.simulator.latency: N_BINS log-spaced bins)
    tpot_s: np.ndarray  # per request; NaN with one output token
    slo: SloTargets | None
    phase_bounds: list[tuple[int, int, str, float]]  # (start, stop, label, start time)
    timeline: list[tuple[float, int, int, str]]  # (t, k, n, active) at each applied update
    controller: FleetController | None = None
    step_log: StepLog | None = None

    JSON_KEYS = (
        "policy",
        "requests",
        "sim_seconds",
        "req_per_s",
        "tok_per_s",
        "out_tok_per_s",
        "ttft_p50_s",
        "ttft_p99_s",
        "tpot_p50_s",
        "tpot_p99_s",
        "itl_p50_s",
        "itl_p99_s",
        "stall_p99_s",
        "stall_max_s",
        "slo",
        "ttft_attainment",
        "itl_attainment",
        "tpot_attainment",
        "goodput_req_per_s",
        "preemptions",
        "mode_switches",
        "k_final",
        "n_final",
    )

    def as_json(self) -> dict:
        """The documented keys; online runs add ``estimate`` and ``first_estimate`` (see :func:`estimate_json`)."""
        report = self.slo_report(self.slo)
        report["slo"] = None if self.slo is None else self.slo.as_json()
        out = {key: report[key] if key in report else getattr(self, key) for key in self.JSON_KEYS}
        if self.controller is not None:
            workload = self.controller.workload
            out["estimate"] = estimate_json(self.controller, workload.estimate)
            out["first_estimate"] = estimate_json(self.controller, workload.first)
        return out

    def slo_report(self, targets: SloTargets | None) -> dict[str, float | None]:
        """Attainment of ``targets`` and goodput (see :func:`ebplus.simulator.latency.slo_report`)."""
        ttft = self.first_token_s - self.arrival_s
        return slo_report(targets, ttft, self.stall_s, self.tpot_s, self.sim_seconds)

    def switches_after(self, completions: int) -> int:
        """Mode switches applied after the ``completions``-th completion and before the last arrival.

        An oscillation count: the controller's first decisions are its cold start, and once
        arrivals stop the load it was serving is gone.
        """
        if self.finish_s.size <= completions:
            return 0
        t = float(np.sort(self.finish_s)[completions - 1]) if completions > 0 else -np.inf
        end = float(np.nanmax(self.arrival_s)) if self.arrival_s.size else np.inf  # then the load drains away
        tl = self.timeline
        return sum(1 for a, b in itertools.pairwise(tl) if b[3] != a[3] and t < b[0] <= end)

    def phase_tok_per_s(self) -> list[float]:
        """Total tokens/s of each phase: its tokens over the time from its start to its last completion."""
        out = []
        for start, stop, _, t0 in self.phase_bounds:
            tokens = int(self.input_len[start:stop].sum() + self.output_len[start:stop].sum())
            span = float(self.finish_s[start:stop].max()) - t0
            out.append(tokens / span if span > 0 else float("nan"))
        return out

    def _steady_rate(self, weights: np.ndarray, lo: float, hi: float) -> float:
        """Rate of ``weights`` (per request) over the window between the ``lo`` and ``hi`` completion quantiles."""
        f = np.sort(self.finish_s)
        return self._rate_between(weights, float(f[int(lo * (f.size - 1))]), float(f[int(hi * (f.size - 1))]))

    def _rate_between(self, weights: np.ndarray, a: float, b: float) -> float:
        """Rate of ``weights`` (per request) between times ``a`` and ``b``.

        Each request is credited pro rata over its life in the engine (first token
        to finish), not at the instant it completes: under EB with a large k whole
        cohorts complete together, and a window edge that falls just before or
        after a burst would swing a completion count by a cohort.
        """
        start, end = self.first_token_s, self.finish_s
        life = end - start
        overlap = np.clip(np.minimum(end, b) - np.maximum(start, a), 0.0, None)
        share = np.where(life > 0, overlap / np.where(life > 0, life, 1.0), ((end > a) & (end <= b)).astype(float))
        return float((weights * share).sum()) / (b - a)

    def steady_req_per_s(self, lo: float = 0.2, hi: float = 0.8) -> float:
        """Requests/s in steady state: between the ``lo`` and ``hi`` quantiles of finish times.

        A saturated run starts with every slot empty and ends draining the last
        requests; neither is the steady state the closed forms describe.
        """
        return self._steady_rate(np.ones(self.finish_s.size), lo, hi)

    def steady_tok_per_s(self, lo: float = 0.2, hi: float = 0.8) -> float:
        """Total (input + output) tokens/s in steady state, as :meth:`steady_req_per_s`."""
        return self._steady_rate((self.input_len + self.output_len).astype(float), lo, hi)

    def loaded_tok_per_s(self, skip: float = 0.25) -> float:
        """Tokens/s computed while requests still arrive: from ``skip`` of the way through the arrivals (the fleet
        filled, the controller's first plans made) to the last arrival. A request's prompt counts when its first
        token is out (its prefill), its output pro rata over its decode (first token to finish).

        ``tok_per_s`` runs to the last completion, so it also measures how a finite trace drains: which
        replica the last long requests went to. This rate is the work done while the load is on.
        """
        first, last = float(np.nanmin(self.arrival_s)), float(np.nanmax(self.arrival_s))
        a = first + skip * (last - first)
        prefilled = float(self.input_len[(self.first_token_s > a) & (self.first_token_s <= last)].sum())
        return prefilled / (last - a) + self._rate_between(self.output_len.astype(float), a, last)


#: The fields of an estimate ``ebplus sim run --json`` and ``ebplus bench sim`` report.
ESTIMATE_KEYS = ("p0", "eta", "mu_o", "mu_l", "theta_star", "method", "model", "gof")


def estimate_json(controller: FleetController, estimate: Estimate | None) -> dict | None:
    """An estimate the controller made, with the theta* its first plan on it came to (``None``: none made).

    ``mu_o`` is the mean *realized* output the closed forms use; ``model`` the departure
    model fitted and ``gof`` its goodness of fit (see :mod:`ebplus.controller.departures`).
    """
    if estimate is None:
        return None
    plan = next((d.plan for d in controller.history if d.estimate == estimate and d.plan is not None), None)
    out = {key: getattr(estimate, key) for key in ESTIMATE_KEYS if key != "theta_star"}
    out["theta_star"] = None if plan is None else plan.theta_star
    return {key: out[key] for key in ESTIMATE_KEYS}


def _pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if x.size else float("nan")


def result_of(replicas: list[Simulator]) -> SimResult:
    """The result of a finished run of one replica, or of a fleet's replicas (which share the per-request arrays:
    each request is served by one of them) as one deployment: latencies over every request, counters summed,
    the final k and N of the first replica."""
    first = replicas[0]
    finished = sum(r.finished for r in replicas)
    span = float(np.nanmax(first.finish_s)) if finished else 0.0
    inp, out = first.inp, first.out
    arrival = first.arrivals.arrival_s
    ttft = first.first_s - arrival
    multi = out > 1
    tpot_all = np.full(out.size, np.nan)
    tpot_all[multi] = (first.finish_s[multi] - first.first_s[multi]) / (out[multi] - 1)
    tpot = tpot_all[multi]
    stall = first.clock.req_gap[multi]
    hist = first.clock.hist if len(replicas) == 1 else np.sum([r.clock.hist for r in replicas], axis=0)
    steps = {kind: sum(r.steps[kind] for r in replicas) for kind in first.steps}
    th = first.machine.thresholds
    reqs = first.reqs
    bounds = [(ph.start, ph.stop, ph.label, first.arrivals.phase_start[i]) for i, ph in enumerate(reqs.phases)]
    return SimResult(
        policy=first.cfg.policy.value,
        requests=len(reqs),
        sim_seconds=span,
        req_per_s=len(reqs) / span,
        tok_per_s=float(inp.sum() + out.sum()) / span,
        out_tok_per_s=float(out.sum()) / span,
        ttft_p50_s=_pct(ttft, 50),
        ttft_p99_s=_pct(ttft, 99),
        tpot_p50_s=_pct(tpot, 50),
        tpot_p99_s=_pct(tpot, 99),
        itl_p50_s=histogram_percentile(hist, 50),
        itl_p99_s=histogram_percentile(hist, 99),
        stall_p99_s=_pct(stall, 99),
        stall_max_s=float(stall.max()) if stall.size else float("nan"),
        preemptions=sum(r.preemptions for r in replicas),
        mode_switches=sum(r.mode_switches for r in replicas),
        k_final=None if th.active is Mode.MB else th.effective_k,
        n_final=th.n,
        steps=steps,
        prefill_tokens=sum(r.prefill_tokens for r in replicas),
        decode_tokens=sum(r.decode_tokens for r in replicas),
        recompute_tokens=sum(r.recompute_tokens for r in replicas),
        max_kv_tokens=max(r.max_kv for r in replicas),
        max_running=max(r.max_running for r in replicas),
        finish_s=first.finish_s,
        arrival_s=arrival,
        first_token_s=first.first_s,
        input_len=inp,
        output_len=out,
        stall_s=first.clock.req_gap,
        itl_hist=hist,
        tpot_s=tpot_all,
        slo=first.cfg.slo,
        phase_bounds=bounds,
        timeline=first.timeline,
        controller=first.controller,
        step_log=first.log,
    )
