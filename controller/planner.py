"""From estimates to thresholds: the EB+ decision for one replica.

The planner turns a workload :class:`~controller.estimator.Estimate` and a
replica's :class:`~controller.cost_model.CostModel` into ``(mode, k, N)`` using the
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

from ebplus.controller import theory
from ebplus.controller.config import PlannerConfig
from ebplus.controller.cost_model import CostModel
from ebplus.controller.estimator import Estimate
from ebplus.controller.messages import Mode, ThresholdUpdate


@dataclass(frozen=True)
class Thresholds:
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


@dataclass(frozen=True)
class Plan(Thresholds):
    """One decision with everything that produced it (shown by the admin API)."""

    active: Mode  # EB or MB
    switched: bool
    crossover: theory.Crossover | None
    reason: str
    kv_scale: float = 1.0  # fraction of the KV capacity N* was sized for (preemption feedback)
    sizing: str = ""  # where k and N came from (reason is the EB/MB decision's)


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


class ThresholdPlanner:
    """Stateful EB+ decision maker for one replica (one GPU type).

    Call :meth:`plan` after each workload update. :meth:`update_for` turns the
    latest plan into the message for a replica in a given configured mode.
    """

    def __init__(self, config: PlannerConfig | None = None, state: PlannerState | None = None) -> None:
        self.config = config or PlannerConfig()
        self.state = state or PlannerState()
        self.last: Plan | None = None

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
    ) -> Plan:
        """Recompute theta*, N*, k and the EB/MB choice from the newest estimate.

        ``preempted``, ``completed``: preemptions and completions the replica reported
        since the previous plan. More than ``kv_backoff_tolerance`` preemptions per
        completion shrink the capacity N* is sized for (``kv_backoff``, in proportion
        up to ``kv_backoff_full``); other windows restore it.
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
        # the closed forms have no KV term: price it at this workload's mean decode context
        cost = cost.folded(context)
        # prefix-cache hits are blocks shared with other requests, held once, not per slot
        shared = max(0.0, estimate.mu_l_prompt - estimate.mu_l)
        kv_tokens = max(1.0, kv_capacity_tokens * st.kv_scale - shared)
        n_prev = st.n_cap
        th = self._thresholds(estimate, cost, kv_tokens, n_obs, n_prev, st.theta, may_grow=settled)
        active, switched, xo, reason = self._choose_mode(estimate, cost, th.k, th.n_eb, th.n_obs)
        st.theta, st.n_cap, st.plans, st.context = th.theta, th.n_cap, st.plans + 1, context
        sizing = self._explain(estimate, th, kv_tokens, n_prev, settled)
        self.last = Plan(
            **vars(th), active=active, switched=switched, crossover=xo, reason=reason, kv_scale=st.kv_scale,
            sizing=sizing,
        )  # fmt: skip
        return self.last

    def _explain(self, estimate: Estimate, th: Thresholds, kv_tokens: float, n_prev: int | None, settled: bool) -> str:
        """Where k and N come from, in one line (the admin API's ``reason`` starts with it)."""
        cfg = self.config
        n_star = th.n_star_clt if cfg.n_star_method == "clt" else th.n_star_paper
        if th.n_cap == n_star:
            how = f"N* ({cfg.n_star_method})"
        elif n_star >= cfg.max_num_seqs and th.n_cap == cfg.max_num_seqs:
            how = "max_num_seqs"
        else:
            how = f"growing toward N* {n_star} (x{cfg.n_growth:g} per plan)" if settled else f"held: estimate moving (N* {n_star})"
        return (
            f"k {th.k} = theta {th.theta:.3f} x N {th.n_eb} (theta* {th.theta_star:.3f} from p0 {estimate.p0:.3g}, "
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
    ) -> Thresholds:
        """theta*, N* and k for one estimate (``cost`` already folded), smoothed against the previous plan's.

        N shrinks to N* at once; it grows toward N* by at most ``n_growth`` per plan,
        and only when ``may_grow`` (the estimate has settled, see ``n_settle``).
        """
        cfg = self.config
        n_prev = n_prev or cfg.max_num_seqs
        ts = theory.theta_star(
            estimate.p0,
            estimate.eta,
            cost.alpha_p,
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
        n_paper = theory.n_star_paper(*n_args)
        n_clt = theory.n_star_clt(*n_args)
        n_star = n_clt if cfg.n_star_method == "clt" else n_paper
        n_grown = min(n_star, math.ceil(n_prev * cfg.n_growth)) if may_grow else n_prev
        n_cap = max(2, n_star if n_star <= n_prev else n_grown)
        n_obs_f = max(float(n_obs), 1.0)
        n_eb = max(2, min(n_cap, math.ceil(n_obs_f)))
        k = min(theory.k_star(theta, n_eb), n_eb - 1)
        return Thresholds(ts.theta0, ts.delta_theta, ts.theta_star, theta, n_paper, n_clt, n_cap, n_obs_f, n_eb, k)

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
            if xo.margin >= -self._band(xo, guess, Mode.MB):
                return None
            margins.append(xo.margin)
        st.active = Mode.EB
        return f"cold: EB wins on all {len(margins)} prior workloads (margins {min(margins):.3g}..{max(margins):.3g} s/token)"

    def _choose_mode(
        self, estimate: Estimate, cost: CostModel, k: int, n_eb: int, n_obs: float
    ) -> tuple[Mode, bool, theory.Crossover | None, str]:
        cfg, st = self.config, self.state
        st.since_switch += 1
        if n_obs < cfg.min_concurrency:
            return st.active, False, None, f"hold: concurrency {n_obs:.1f} < {cfg.min_concurrency:g}"
        xo = self._crossover(estimate, cost, k, n_eb)
        ref = st.n_obs_at_switch
        moved = ref is not None and not (ref / cfg.cooldown_reset <= n_obs <= ref * cfg.cooldown_reset)
        if st.since_switch <= cfg.cooldown and not moved:
            return st.active, False, xo, f"hold: cooldown ({st.since_switch}/{cfg.cooldown} updates)"
        band = self._band(xo, estimate, st.active)
        if st.active is Mode.EB and xo.margin > cfg.sticky_eb * band:
            target = Mode.MB
        elif st.active is Mode.MB and xo.margin < -band:
            target = Mode.EB
        else:
            side = "MB" if xo.margin > 0 else "EB"
            return (
                st.active,
                False,
                xo,
                f"keep {st.active.value}: margin {xo.margin:.3g} s/token favours {side} within hysteresis",
            )
        st.active, st.since_switch, st.n_obs_at_switch = target, 0, n_obs
        return target, True, xo, f"switch to {target.value}: margin {xo.margin:.3g} s/token"

    def _crossover(self, estimate: Estimate, cost: CostModel, k: int, n_eb: int) -> theory.Crossover:
        return theory.crossover(
            k,
            n_eb,
            cost.alpha_p,
            cost.alpha_d,
            cost.beta_p,
            cost.beta_d,
            cost.beta_mb,
            estimate.mu_l,
            estimate.mu_o,
            alpha_mb=cost.alpha_mixed,
            budget=self.config.max_num_batched_tokens,
        )

    def _band(self, xo: theory.Crossover, estimate: Estimate, active: Mode) -> float:
        """Hysteresis margin (s/token): ``delta`` plus ``delta_rel`` of the running mode's per-token time."""
        per_token = xo.t_eb if active is Mode.EB else xo.t_mb
        return self.config.delta + self.config.delta_rel * per_token

    def update_for(self, mode: Mode, version: int) -> ThresholdUpdate:
        """The message for a replica configured in ``mode`` after the latest plan."""
        if self.last is None:
            return self.cold_update(mode, version)
        plan = self.last
        return ThresholdUpdate(mode=mode, k=plan.k, n=plan.n_cap, version=version, active=plan.active)
