"""From estimates to thresholds: the EB+ decision for one replica.

The planner turns a workload :class:`~ebplus.controller.estimator.Estimate` and a
replica's :class:`~ebplus.controller.cost_model.CostModel` into ``(mode, k, N)`` using the
closed forms of :mod:`controller.theory`, plus the small amount of state the
online controller needs: an EMA of ``theta``, gradual growth of ``N``, and the
hysteresis and cooldown of the EB/MB switch. The simulator and the controller
actor both use this class, so the policy evaluated offline is the one deployed.

Definitions used here:

* ``n_cap`` is the memory-safe cap on running requests (``N*``, at most
  ``max_num_seqs``).
* ``n_obs`` is the observed demand (an EMA of running + waiting requests). The EB
  batch is ``n_eb = min(n_cap, n_obs)`` and ``k = floor(theta * n_eb)``: the paper's
  ``k* = theta* * N_current``. Under saturation ``n_eb = n_cap``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ebplus.controller import latency, theory
from ebplus.controller.config import PlannerConfig
from ebplus.controller.cost_model import CostModel
from ebplus.controller.estimator import Estimate
from ebplus.controller.evidence import (
    Judgement,
    LatencyMeasurement,
    ModeCheck,
    ModeEvidence,
    ModeMeasurement,
    OperatingPoint,
)
from ebplus.controller.messages import Mode, ThresholdUpdate

_OTHER = {Mode.EB: Mode.MB, Mode.MB: Mode.EB}


@dataclass(frozen=True)
class Sizing:
    """theta*, N* and k for one estimate: what a plan sets, before the EB/MB choice."""

    theta0: float
    delta_theta: float
    theta_star: float  # this update's clamped theta*
    theta: float  # the smoothed theta actually applied
    n_star_paper: int
    n_star_clt: int
    n_cap: int
    n_obs: float
    n_eb: int
    k: int
    k_throughput: int = 0  # theta x N, before the latency rule (0: not applied)
    prefill_steps: int = 0  # EB's prefill runs: a decode step after this many prefill steps (0: none)
    prefill_tokens: int = 0  # EB's prefill steps carry at most this many tokens (0: the engine's budget)


@dataclass(frozen=True, kw_only=True)
class Plan(Sizing):
    """One decision with everything that produced it (shown by the admin API)."""

    active: Mode  # EB or MB
    switched: bool
    crossover: theory.Crossover | None
    reason: str
    kv_scale: float = 1.0  # fraction of the KV capacity N* was sized for (preemption feedback)
    sizing: str = ""  # where k and N came from (reason is the EB/MB decision's)
    judgement: Judgement | None = None  # both modes, predicted and as measured (the closed loop)
    k_choice: latency.KChoice | None = None  # the latency rule's pick of k (None: k = theta x N)


@dataclass
class PlannerState:
    """The mutable part, kept explicit so it can be persisted and restored."""

    theta: float | None = None
    n_cap: int | None = None
    active: Mode = Mode.MB  # cold start in MB (authors' default)
    since_switch: int = 1 << 30
    plans: int = 0
    kv_scale: float = 1.0
    n_obs_at_switch: float | None = None
    context: float | None = None  # the decode context the last plan was made for (n_settle)
    cold_capped: bool = False  # the cold N cap was computed (see ThresholdPlanner.cold_cap)
    exploring: Mode | None = None  # the mode being measured (see LoopConfig), until it has min_steps
    explore_return: Mode | None = None  # the mode the exploration left
    explore_started: int = 0  # plans at its start
    explore_mark: tuple[int, int] = (0, 0)  # the explored mode's evidence when it started (ModeEvidence.mark)
    explore_ended: int = -(1 << 30)  # plans when the last exploration ended
    explorations: int = 0


class ThresholdPlanner:
    """Stateful EB+ decision maker for one replica (one GPU type).

    Call :meth:`plan` after each workload update. :meth:`update_for` turns the
    latest plan into the message for a replica in a given configured mode.
    """

    def __init__(self, config: PlannerConfig | None = None, state: PlannerState | None = None) -> None:
        self.config = config or PlannerConfig()
        self.state = state or PlannerState()
        self.last: Plan | None = None
        #: the newest plan's judgement that had one (a plan below ``min_concurrency`` judges nothing): what the
        #: replicas' capacities are read from for scaling (:mod:`ebplus.controller.scaling`)
        self.judged: Judgement | None = None

    def cold_update(self, mode: Mode, version: int = 0) -> ThresholdUpdate:
        """Thresholds before any estimate: ``theta_cold`` of ``max_num_seqs``."""
        n = self.state.n_cap or self.config.max_num_seqs
        k = theory.k_star(self.state.theta or self.config.theta_cold, n)
        return ThresholdUpdate(mode=mode, k=k, n=n, version=version, active=self.state.active)

    def plan(
        self,
        estimate: Estimate,
        cost: CostModel,
        kv_capacity_tokens: float,
        n_obs: float,
        preempted: int = 0,
        completed: int = 0,
        evidence: ModeEvidence | None = None,
        explore: bool = False,
        load: float | None = None,
    ) -> Plan:
        """Recompute theta*, N*, k and the EB/MB choice from the newest estimate.

        ``preempted``, ``completed``: preemptions and completions the replica reported
        since the previous plan. More than ``kv_backoff_tolerance`` preemptions per
        completion shrink the capacity N* is sized for (``kv_backoff``, in proportion
        up to ``kv_backoff_full``); other windows restore it.

        ``evidence``: the replica's measured steps per mode; each mode's predicted time is
        scaled by its measured bias (``config.loop``). ``explore``: the replica runs
        what it is told (``auto``), so a mode without evidence may be run to measure it.
        ``load``: tokens/s the replica computed since the previous plan (with SLO targets,
        a load both modes carry with headroom is served by the one with more latency margin).
        """
        cfg, st = self.config, self.state
        if preempted > cfg.kv_backoff_tolerance * completed:
            rate = preempted / max(completed, 1)
            severity = 1.0 if cfg.kv_backoff_full <= 0 else min(1.0, rate / cfg.kv_backoff_full)
            st.kv_scale *= 1.0 - (1.0 - cfg.kv_backoff) * severity
        else:
            st.kv_scale = min(1.0, st.kv_scale * cfg.kv_recover)
        context = estimate.decode_context
        settled = st.context is None or abs(context / st.context - 1.0) <= cfg.n_settle
        # evidence is priced with the model the steps were timed against: KV term and all
        looped = evidence is not None and cfg.loop.enabled
        measured = evidence.measure_all(cost) if looped else {}
        seen = {m: evidence.latency(m) for m in (Mode.EB, Mode.MB)} if looped else {}
        # the closed forms have no KV term: price it at this workload's mean decode context
        cost = cost.folded(context)
        # prefix-cache hits are blocks shared with other requests, held once, not per slot
        shared = max(0.0, estimate.mu_l_prompt - estimate.mu_l)
        kv_tokens = max(1.0, kv_capacity_tokens * st.kv_scale - shared)
        n_prev = st.n_cap
        cycle_s = self._cycle_cost(measured.get(Mode.EB), cost)
        sizes = self._sizes(estimate, cost, kv_tokens, n_obs, n_prev, st.theta, may_grow=settled, cycle_s=cycle_s)
        prices = latency.Prices()  # this plan's: EB and MB are priced at the same points by several steps
        k_choice = self._choose_k(estimate, cost, *sizes[6:], cycle_s, prices)
        if k_choice is None:
            th = Sizing(*sizes)
        else:  # the latency rule's k, theta x N kept beside it: one Sizing either way
            th = Sizing(*sizes[:9], k_choice.k, sizes[9], k_choice.bound.steps, k_choice.bound.tokens)
        active, switched, xo, reason, judgement = self._choose_mode(
            estimate, cost, th, measured, evidence, explore and cfg.loop.enabled, cycle_s, k_choice, load, seen, prices
        )
        st.theta, st.n_cap, st.plans, st.context = th.theta, th.n_cap, st.plans + 1, context
        sizing = self._explain(estimate, th, kv_tokens, n_prev, settled)
        self.last = Plan(
            **vars(th), active=active, switched=switched, crossover=xo, reason=reason, kv_scale=st.kv_scale,
            sizing=sizing, judgement=judgement, k_choice=k_choice,
        )  # fmt: skip
        self.judged = judgement or self.judged
        return self.last

    def _explain(self, estimate: Estimate, th: Sizing, kv_tokens: float, n_prev: int | None, settled: bool) -> str:
        """Where k and N come from, in one line (the admin API's ``reason`` starts with it)."""
        cfg = self.config
        n_star = th.n_star_clt if cfg.n_star_method == "clt" else th.n_star_paper
        if th.n_cap == n_star:
            how = f"N* ({cfg.n_star_method})"
        elif n_star >= cfg.max_num_seqs and th.n_cap == cfg.max_num_seqs:
            how = "max_num_seqs"
        else:
            how = (
                f"growing toward N* {n_star} (x{cfg.n_growth:g} per plan)"
                if settled
                else f"held: estimate moving (N* {n_star})"
            )
        k_part = f"k {th.k} = theta {th.theta:.3f} x N {th.n_eb}"
        if th.k_throughput:
            k_part = f"k {th.k} by latency (theta {th.theta:.3f} x N {th.n_eb} = {th.k_throughput})"
        return (
            f"{k_part} (theta* {th.theta_star:.3f} from p0 {estimate.p0:.3g}, "
            f"eta {estimate.eta:.2g}: {estimate.method}); N {th.n_cap} = {how} for {kv_tokens:.0f} KV tokens, "
            f"{estimate.mu_l:.0f} prompt + {estimate.mean_age:.0f} mean-age tokens a slot (mu_o {estimate.mu_o:.0f}, "
            f"{estimate.model})"
        )

    def _thresholds(
        self,
        estimate: Estimate,
        cost: CostModel,
        kv_tokens: float,
        n_obs: float,
        n_prev: int | None,
        theta_prev: float | None,
        may_grow: bool = True,
        cycle_s: float = 0.0,
    ) -> Sizing:
        """:meth:`_sizes` as a :class:`Sizing` (k = theta x N)."""
        return Sizing(*self._sizes(estimate, cost, kv_tokens, n_obs, n_prev, theta_prev, may_grow, cycle_s))

    def _sizes(
        self,
        estimate: Estimate,
        cost: CostModel,
        kv_tokens: float,
        n_obs: float,
        n_prev: int | None,
        theta_prev: float | None,
        may_grow: bool = True,
        cycle_s: float = 0.0,
    ) -> tuple[float, float, float, float, int, int, int, float, int, int]:
        """theta*, N* and k for one estimate (``cost`` already folded), smoothed against the previous plan's:
        :class:`Sizing`'s first ten fields, in its order (a plan builds its Sizing once, with the latency rule's k).

        N shrinks to N* at once; it grows toward N* by at most ``n_growth`` per plan,
        and only when ``may_grow`` (the estimate has settled, see ``n_settle``). ``cycle_s``,
        EB's measured cost per cycle beyond its steps, is part of a prefill phase's fixed cost
        in theta*.
        """
        cfg = self.config
        n_prev = n_prev or cfg.max_num_seqs
        ts = theory.theta_star(
            estimate.p0,
            estimate.eta,
            cost.alpha_p + cycle_s,
            cost.alpha_d,
            cost.beta_d,
            n_prev,
            theta_min=cfg.theta_min,
            theta_max=cfg.theta_max,
            delta_max_factor=cfg.delta_max_factor,
        )
        theta = ts.theta_star if theta_prev is None else theta_prev + cfg.theta_ema * (ts.theta_star - theta_prev)
        # eqs. (6) and the CLT form use 1/p0 as the mean age of a running request (geometric outputs)
        p_age = estimate.p0 if cfg.n_star_age == "geometric" else min(1.0, 1.0 / max(estimate.mean_age, 1.0))
        n_args = (kv_tokens, cfg.eps, p_age, estimate.mu_l, ts.theta0, cfg.max_num_seqs)
        n_paper, n_clt = theory.n_stars(*n_args)
        n_star = n_clt if cfg.n_star_method == "clt" else n_paper
        n_grown = min(n_star, math.ceil(n_prev * cfg.n_growth)) if may_grow else n_prev
        n_cap = max(2, n_star if n_star <= n_prev else n_grown)
        n_obs_f = max(float(n_obs), 1.0)
        n_eb = max(2, min(n_cap, math.ceil(n_obs_f)))
        k = min(theory.k_star(theta, n_eb), n_eb - 1)
        return ts.theta0, ts.delta_theta, ts.theta_star, theta, n_paper, n_clt, n_cap, n_obs_f, n_eb, k

    def _cycle_cost(self, eb: ModeMeasurement | None, cost: CostModel) -> float:
        """EB's measured seconds per cycle beyond what its steps cost in the model (never below -alpha_p / 2)."""
        if eb is None or eb.phases < self.config.loop.min_phases:
            return 0.0
        return max(eb.excess_per_phase, -0.5 * cost.alpha_p)

    def _choose_k(
        self, estimate: Estimate, cost: CostModel, n_cap: int, n_obs: float, n_eb: int, k: int, cycle_s: float,
        prices: latency.Prices | None = None,
    ) -> latency.KChoice | None:  # fmt: skip
        """The latency rule (``config.slo``) for k = theta x N ``k`` at batch ``n_eb``; ``None`` keeps that k
        (tolerance 0, no targets).

        The tolerance spends throughput the closed forms call flat in k. Where departures are
        the caps themselves (``model: caps``, every request ends at its cap) they are not what
        the engine sees: cohorts admitted together leave together, the best fixed k is far
        above the predicted optimum (RTX PRO 6000, all capped: 128 against ~40), and any
        tolerance lost more than 2% in the simulator. There the rule keeps k* unless targets
        ask for latency.
        """
        slo = self.config.slo
        if estimate.model == "caps" and not slo.targets:
            slo = slo.model_copy(update={"tolerance": 0.0})
        if slo.tolerance <= 0 and not slo.targets:
            return None
        queue = max(0.0, n_obs - n_cap)
        return latency.choose_k(
            k, n_eb, cost, estimate.mu_l, estimate.mu_o, self.config.max_num_batched_tokens, slo, cycle_s, queue, prices
        )

    def cold_cap(self, kv_capacity_tokens: float, mu_l: float, mu_o: float) -> int | None:
        """Before the first estimate: cap N at the N* of a cold guess of the workload, once.

        ``mu_l`` is what the replica's running requests' prompts measure, ``mu_o`` the
        output the KV is reserved for (``cold_output_tokens``, or smaller caps). Returns
        the new cap if it lowered N, else ``None``.
        """
        cfg, st = self.config, self.state
        if self.last is not None or st.cold_capped:
            return None
        st.cold_capped = True
        guess = Estimate.geometric(max(mu_l, 1.0), max(mu_o, 1.0), method="cold guess")
        t0 = theory.theta0(guess.p0, 1.0, 1.0)  # the CLT form's spread depends on theta0 only weakly
        p_age = min(1.0, 1.0 / max(guess.mean_age, 1.0))
        n_star = theory.n_star_clt(kv_capacity_tokens * st.kv_scale, cfg.eps, p_age, guess.mu_l, t0, cfg.max_num_seqs)
        current = st.n_cap or cfg.max_num_seqs
        if n_star >= current:
            return None
        st.n_cap = max(2, n_star)
        return st.n_cap

    def cold_choice(self, cost: CostModel, kv_capacity_tokens: float, n_obs: float) -> str | None:
        """Before the first estimate: switch MB -> EB if the prior prefers EB whatever the workload.

        Nothing is known of the traffic yet but the observed concurrency, so EB+ leaves its
        cold MB only for a choice that does not depend on the unknown: EB must beat MB by
        the hysteresis band for every workload of ``cold_workloads``, each planned as a
        first estimate would be (theta*, N*, k for geometric outputs of that mean). On a
        bandwidth-limited GPU at high concurrency that holds and saves the cold period
        in the slower mode; at low concurrency, or on a GPU where the answer depends on
        the traffic, nothing changes. Returns the reason when it switched, else ``None``.
        """
        cfg, st = self.config, self.state
        if self.last is not None or st.active is not Mode.MB or not cfg.cold_workloads:
            return None
        if n_obs < cfg.min_concurrency:
            return None
        margins = []
        for mu_l, mu_o in cfg.cold_workloads:
            guess = Estimate.geometric(mu_l, mu_o, method="cold prior")
            folded = cost.folded(guess.decode_context)
            th = self._thresholds(guess, folded, kv_capacity_tokens * st.kv_scale, n_obs, None, None)
            xo = self._crossover(guess, folded, th.k, th.n_eb)
            if xo.margin >= -self.config.delta - self.config.delta_rel * xo.t_mb:
                return None
            margins.append(xo.margin)
        st.active = Mode.EB
        return f"cold: EB wins on all {len(margins)} prior workloads (margins {min(margins):.3g}..{max(margins):.3g} s/token)"

    def _choose_mode(
        self,
        estimate: Estimate,
        cost: CostModel,
        th: Sizing,
        measured: dict[Mode, ModeMeasurement],
        evidence: ModeEvidence | None,
        explore: bool,
        cycle_s: float = 0.0,
        k_choice: latency.KChoice | None = None,
        load: float | None = None,
        seen: dict[Mode, LatencyMeasurement | None] | None = None,
        prices: latency.Prices | None = None,
    ) -> tuple[Mode, bool, theory.Crossover | None, str, Judgement | None]:
        """The EB/MB choice: the model's two predictions, each corrected by what its mode measured.

        Hysteresis (``delta``, ``delta_rel``, ``sticky_eb``) and a cooldown keep the
        choice from flapping on noise; an exploration runs the other mode until it has
        ``loop.min_steps`` steps of evidence, then decides as if it had never left.
        """
        cfg, st = self.config, self.state
        st.since_switch += 1
        if th.n_obs < cfg.min_concurrency:
            if st.exploring is not None:  # nothing to learn at this load: go back
                st.active, st.exploring, st.explore_ended = st.explore_return or st.active, None, st.plans
                return (
                    st.active,
                    True,
                    None,
                    f"explore ended: concurrency {th.n_obs:.1f} < {cfg.min_concurrency:g}",
                    None,
                )
            return st.active, False, None, f"hold: concurrency {th.n_obs:.1f} < {cfg.min_concurrency:g}", None
        prices = prices or latency.Prices()
        xo = self._crossover(estimate, cost, th.k, th.n_eb, prices)
        j = self._judge(xo, measured, estimate, cost, th, cycle_s, k_choice, load, seen or {}, prices)
        if st.exploring is not None:
            return self._explore_step(j, xo, evidence, th.n_obs)
        ref = st.n_obs_at_switch
        moved = ref is not None and not (ref / cfg.cooldown_reset <= th.n_obs <= ref * cfg.cooldown_reset)
        if st.since_switch <= cfg.cooldown and not moved:
            return st.active, False, xo, f"hold: cooldown ({st.since_switch}/{cfg.cooldown} updates)", j
        target = self._rule(j, st.active)
        if target is None:
            if explore and self._should_explore(j):
                return self._start_exploring(j, xo, evidence)
            side = "MB" if j.margin > 0 else "EB"
            why = f"keep {st.active.value}: margin {j.margin:.3g} s/token favours {side} within hysteresis"
            return st.active, False, xo, why + self._biases(j), j
        st.active, st.since_switch, st.n_obs_at_switch = target, 0, th.n_obs
        return target, True, xo, f"switch to {target.value}: margin {j.margin:.3g} s/token" + self._biases(j), j

    def _rule(self, j: Judgement, active: Mode) -> Mode | None:
        """The other mode if it wins, else ``None``: the one mode predicted to meet the SLO targets,
        or, where both or neither do, the faster by more than the hysteresis band."""
        if j.eb.meets is not None and j.eb.meets != j.mb.meets:
            feasible = Mode.EB if j.eb.meets else Mode.MB
            return None if feasible is active else feasible
        band = self._band(j, active)
        if active is Mode.EB and j.margin > self.config.sticky_eb * band:
            return Mode.MB
        if active is Mode.MB and j.margin < -band:
            return Mode.EB
        return None

    def _judge(
        self,
        xo: theory.Crossover,
        measured: dict[Mode, ModeMeasurement],
        estimate: Estimate,
        cost: CostModel,
        th: Sizing,
        cycle_s: float,
        k_choice: latency.KChoice | None,
        load: float | None = None,
        seen: dict[Mode, LatencyMeasurement | None] | None = None,
        prices: latency.Prices | None = None,
    ) -> Judgement:
        """Both modes' predictions corrected by their evidence: EB's per-cycle excess, MB's bias (1.0 unmeasured).

        With SLO targets each mode's latency is checked against them: the p99 TTFT and stall
        its own requests saw when it has run at this load (``seen``), else the prediction
        (MB's step times scaled by its bias), which must clear the targets by ``slo.safety``.
        """
        cfg, prices = self.config, prices or latency.Prices()
        here = measured.get(self.state.active)
        point = OperatingPoint(here.running if here is not None else th.n_obs, estimate.mu_l, estimate.mu_o)
        budget, queue = cfg.max_num_batched_tokens, max(0.0, th.n_obs - th.n_cap)
        args = (cost.alpha_p, cost.alpha_d, cost.beta_p, cost.beta_d, estimate.mu_l, estimate.mu_o, budget, cycle_s)
        if th.prefill_tokens:  # capped prefill steps: more of them a phase
            args = (*args[:6], th.prefill_tokens, cycle_s)
        tokens = estimate.mu_l + estimate.mu_o
        t_eb = 1.0 / (prices.tp_eb(th.k, th.n_eb, *args) * tokens)
        t_eb_model = 1.0 / (prices.tp_eb(th.k, th.n_eb, *args[:7], 0.0) * tokens)  # as planned, nothing measured
        # each mode's capacity (tokens/s) with the batch at its cap
        k_cap = min(th.n_cap - 1, max(1, round(th.k * th.n_cap / th.n_eb)))
        capacity = {
            Mode.EB: prices.tp_eb(k_cap, th.n_cap, *args) * tokens,
            Mode.MB: prices.mb_steps(th.n_cap, cost.alpha_mixed, cost.beta_mb, cost.alpha_d, cost.beta_d,
                                     estimate.mu_l, estimate.mu_o, budget).tp * tokens,
        }  # fmt: skip
        eb_lat = mb_lat = None
        if cfg.slo.targets:
            eb_lat = k_choice.latency if k_choice is not None else None
            mb_bias = measured[Mode.MB].bias if Mode.MB in measured else 1.0
            mb_lat = latency.mb_latency(th.n_eb, cost, estimate.mu_l, estimate.mu_o, budget, queue, prices)
            mb_lat = latency.Latency(mb_lat.ttft_p99 * mb_bias, mb_lat.itl_p99 * mb_bias, mb_lat.stall * mb_bias)
        checks = {}
        for mode, predicted, corrected, lat in ((Mode.EB, t_eb_model, t_eb, eb_lat), (Mode.MB, xo.t_mb, None, mb_lat)):
            m = measured.get(mode)
            if corrected is None:
                corrected = predicted * (1.0 if m is None else m.bias)
            stale = m is not None and not m.point.near(point, cfg.loop.explore_reset)
            lm = None if stale else (seen or {}).get(mode)
            need = cfg.slo.safety
            if lat is not None and lm is not None:  # measured: what the requests saw, no safety margin needed
                lat, need = latency.Latency(lm.ttft_p99, lat.itl_p99, lm.stall_p99), 0.0
            margin = None if lat is None else lat.margin(cfg.slo)
            meets = None if margin is None else margin >= need
            bias = corrected / predicted
            cap = capacity[mode] if mode is Mode.EB else capacity[mode] / bias
            checks[mode] = ModeCheck(
                mode, predicted, bias, corrected, m, stale, lat, meets, latency_measured=lm, capacity=cap
            )
        return Judgement.of_checks(checks[Mode.EB], checks[Mode.MB], self.state.exploring, load)

    @staticmethod
    def _biases(j: Judgement) -> str:
        parts = [f"{c.mode.value} x{c.bias:.3f}" for c in (j.eb, j.mb) if c.measured is not None]
        return f" (measured bias {', '.join(parts)})" if parts else ""

    def _should_explore(self, j: Judgement) -> bool:
        """The other mode has no evidence at this load, and the model's preference for this one is thin."""
        loop, st = self.config.loop, self.state
        if loop.explore_below <= 0 or st.plans - st.explore_ended < loop.explore_spacing:
            return False
        current, other = j.of(st.active), j.of(_OTHER[st.active])
        if other.measured is not None and not other.stale:
            return False
        return (other.corrected - current.corrected) / current.corrected < loop.explore_below

    def _start_exploring(
        self, j: Judgement, xo: theory.Crossover, evidence: ModeEvidence | None
    ) -> tuple[Mode, bool, theory.Crossover | None, str, Judgement | None]:
        st = self.state
        other = _OTHER[st.active]
        gain = (j.of(other).corrected - j.of(st.active).corrected) / j.of(st.active).corrected
        why = "stale evidence" if j.of(other).measured is not None else "no evidence"
        st.explore_return, st.exploring, st.active = st.active, other, other
        st.explore_started, st.explorations = st.plans, st.explorations + 1
        st.explore_mark = (0, 0) if evidence is None else evidence.mark(other)
        reason = (
            f"explore {other.value}: {why} of {other.value} at this load and the model prefers "
            f"{st.explore_return.value} by only {gain:.1%} (< {self.config.loop.explore_below:.0%})"
        )
        return other, True, xo, reason, Judgement.of_checks(j.eb, j.mb, other, j.load)

    def _explore_step(
        self, j: Judgement, xo: theory.Crossover, evidence: ModeEvidence | None, n_obs: float
    ) -> tuple[Mode, bool, theory.Crossover | None, str, Judgement | None]:
        """During an exploration: keep measuring, or decide from the mode it left, with no cooldown."""
        loop, st = self.config.loop, self.state
        explored = st.exploring
        assert explored is not None
        done = evidence is None or evidence.enough_since(explored, st.explore_mark)
        if not done and st.plans - st.explore_started < loop.explore_max_plans:
            gained = evidence.mark(explored)[0] - st.explore_mark[0] if evidence is not None else 0
            reason = f"explore {explored.value}: measuring ({gained}/{loop.min_steps} steps)"
            return explored, False, xo, reason, Judgement.of_checks(j.eb, j.mb, explored, j.load)
        back = st.explore_return or _OTHER[explored]
        st.exploring, st.explore_ended = None, st.plans
        target = self._rule(j, back)
        if target is explored:  # the measurement confirmed the other mode: a switch like any other
            st.active, st.since_switch, st.n_obs_at_switch = explored, 0, n_obs
            return (
                explored,
                False,
                xo,
                f"explored {explored.value}, stay: margin {j.margin:.3g} s/token" + self._biases(j),
                j,
            )
        st.active = back
        return (
            back,
            True,
            xo,
            f"explored {explored.value}, back to {back.value}: margin {j.margin:.3g} s/token" + self._biases(j),
            j,
        )

    def _crossover(
        self, estimate: Estimate, cost: CostModel, k: int, n_eb: int, prices: latency.Prices | None = None
    ) -> theory.Crossover:
        """:func:`theory.crossover` of EB(k) and MB at ``n_eb``, priced through ``prices`` (a plan's book)."""
        prices = prices or latency.Prices()
        budget, mu_l, mu_o = self.config.max_num_batched_tokens, estimate.mu_l, estimate.mu_o
        te = prices.tp_eb(k, n_eb, cost.alpha_p, cost.alpha_d, cost.beta_p, cost.beta_d, mu_l, mu_o, budget)
        mb = prices.mb_steps(n_eb, cost.alpha_mixed, cost.beta_mb, cost.alpha_d, cost.beta_d, mu_l, mu_o, budget)
        return theory.crossover_of(te, mb, mu_l, mu_o)

    def _band(self, j: Judgement, active: Mode) -> float:
        """Hysteresis margin (s/token): ``delta`` plus ``delta_rel`` of the running mode's per-token time."""
        return self.config.delta + self.config.delta_rel * j.of(active).corrected

    def update_for(self, mode: Mode, version: int) -> ThresholdUpdate:
        """The message for a replica configured in ``mode`` after the latest plan."""
        if self.last is None:
            return self.cold_update(mode, version)
        plan = self.last
        return ThresholdUpdate(
            mode=mode,
            k=plan.k,
            n=plan.n_cap,
            version=version,
            active=plan.active,
            prefill_steps=plan.prefill_steps,
            prefill_tokens=plan.prefill_tokens,
        )
