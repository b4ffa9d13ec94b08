"""ThresholdPlanner: theta smoothing, N growth, hysteresis and cooldown of the EB/MB switch."""

from __future__ import annotations

import dataclasses
import math

import pytest
from pydantic import TypeAdapter

from ebplus.controller import theory
from ebplus.controller.config import PlannerConfig, SloConfig
from ebplus.controller.cost_model import CostModel
from ebplus.controller.estimator import Estimate
from ebplus.controller.messages import Mode
from ebplus.controller.planner import Plan, ThresholdPlanner

H200 = CostModel(
    alpha_p=1.2786e-3, beta_p=2.4853e-5, alpha_d=8.921e-3, beta_d=4.586e-5, beta_mb=(2.494e-5, 5.193e-5, 1.478e-5)
)


def estimate(p0: float = 1 / 256, eta: float = 0.0, mu_l: float = 512.0) -> Estimate:
    return Estimate(
        p0=p0,
        eta=eta,
        mu_l=mu_l,
        mu_o=1 / p0,
        n_samples=500,
        n_censored=0,
        method="mle: linear hazard",
        timestamp=0.0,
    )


def cost_with_mixing(extra: float) -> CostModel:
    """H200 costs with a mixed-step per-token cost of EB's weighted cost + ``extra``."""
    b = theory.beta_eb_weighted(H200.beta_p, H200.beta_d, 512, 256)
    return H200.model_copy(update={"beta_mb": (b + extra, 0.0, 0.0)})


def test_cold_update_is_mb_with_cold_theta() -> None:
    p = ThresholdPlanner(PlannerConfig(max_num_seqs=1000, theta_cold=0.1))
    u = p.cold_update(Mode.AUTO)
    assert (u.active, u.k, u.n, u.version) == (Mode.MB, 100, 1000, 0)


#: The throughput-optimal k = theta* x N, without the latency rule.
THROUGHPUT_K = SloConfig(tolerance=0.0)


def test_first_plan_uses_closed_forms() -> None:
    cfg = PlannerConfig(max_num_seqs=1024, slo=THROUGHPUT_K)
    p = ThresholdPlanner(cfg)
    plan = p.plan(estimate(), H200, kv_capacity_tokens=10**9, n_obs=5000)
    t0 = theory.theta0(1 / 256, H200.alpha_p, H200.alpha_d)
    assert plan.theta0 == pytest.approx(t0)
    assert plan.delta_theta == 0.0 and plan.theta == pytest.approx(t0)
    assert plan.n_cap == 1024 and plan.n_eb == 1024
    assert plan.k == theory.k_star(t0, 1024)
    assert p.update_for(Mode.EB, 7).k == plan.k and p.update_for(Mode.EB, 7).version == 7


def test_k_follows_observed_concurrency_below_cap() -> None:
    p = ThresholdPlanner(PlannerConfig(max_num_seqs=1024, slo=THROUGHPUT_K))
    plan = p.plan(estimate(), H200, kv_capacity_tokens=10**9, n_obs=100)
    assert plan.n_eb == 100 and plan.k == theory.k_star(plan.theta, 100)
    latency_aware = ThresholdPlanner(PlannerConfig(max_num_seqs=1024)).plan(estimate(), H200, 10**9, n_obs=100)
    assert latency_aware.k_throughput == plan.k and latency_aware.k <= plan.k


def test_departures_that_are_the_caps_keep_the_throughput_k() -> None:
    """Every request ended at its cap (``model: caps``): the closed forms' flat optimum is not
    what the engine sees, so no throughput is spent for latency unless targets ask for it."""
    capped = dataclasses.replace(estimate(), model="caps")
    default = PlannerConfig(max_num_seqs=1024)
    assert default.slo.tolerance > 0
    plan = ThresholdPlanner(default).plan(capped, H200, 10**9, n_obs=5000)
    throughput = ThresholdPlanner(PlannerConfig(max_num_seqs=1024, slo=THROUGHPUT_K)).plan(capped, H200, 10**9, 5000)
    assert plan.k == throughput.k
    natural = ThresholdPlanner(default).plan(estimate(), H200, 10**9, n_obs=5000)
    assert natural.k < natural.k_throughput  # the rule still applies to natural stops
    targets = PlannerConfig(max_num_seqs=1024, slo=SloConfig(max_stall_s=0.3))
    assert ThresholdPlanner(targets).plan(capped, H200, 10**9, n_obs=1024).k < plan.k


def test_theta_is_smoothed() -> None:
    cfg = PlannerConfig(max_num_seqs=1024, theta_ema=0.3)
    p = ThresholdPlanner(cfg)
    a = p.plan(estimate(p0=1 / 256), H200, 10**9, 5000).theta
    target = theory.theta0(1 / 32, H200.alpha_p, H200.alpha_d)
    b = p.plan(estimate(p0=1 / 32), H200, 10**9, 5000).theta
    assert b == pytest.approx(a + 0.3 * (target - a))


def test_n_shrinks_at_once_and_grows_gradually() -> None:
    p = ThresholdPlanner(PlannerConfig(max_num_seqs=4096, n_growth=1.5))
    small = p.plan(estimate(), H200, kv_capacity_tokens=200_000, n_obs=9999)
    assert small.n_cap == small.n_star_clt < 4096
    big = p.plan(estimate(), H200, kv_capacity_tokens=10**9, n_obs=9999)
    assert big.n_cap == math.ceil(small.n_cap * 1.5)


def test_paper_method_selectable() -> None:
    p = ThresholdPlanner(PlannerConfig(max_num_seqs=4096, n_star_method="paper"))
    plan = p.plan(estimate(), H200, kv_capacity_tokens=300_000, n_obs=9999)
    assert plan.n_cap == plan.n_star_paper != plan.n_star_clt


def test_switches_to_eb_when_mixing_costs_more() -> None:
    p = ThresholdPlanner(PlannerConfig(max_num_seqs=1024, cooldown=0))
    plan = p.plan(estimate(), cost_with_mixing(1e-4), 10**9, 5000)
    assert plan.switched and plan.active is Mode.EB
    assert plan.crossover is not None and plan.crossover.winner is theory.Winner.EB


def test_no_decision_at_low_concurrency() -> None:
    p = ThresholdPlanner(PlannerConfig(max_num_seqs=1024, min_concurrency=16))
    plan = p.plan(estimate(), cost_with_mixing(1e-4), 10**9, n_obs=8)
    assert plan.active is Mode.MB and not plan.switched and plan.crossover is None


def test_hysteresis_and_sticky_eb() -> None:
    cfg = PlannerConfig(max_num_seqs=1024, cooldown=0, delta=5e-6, sticky_eb=3.0)
    p = ThresholdPlanner(cfg)
    assert p.plan(estimate(), cost_with_mixing(1e-4), 10**9, 5000).active is Mode.EB
    # MB now slightly better, but not by 3*delta: stay in EB
    plan = p.plan(estimate(), cost_with_mixing(0.0), 10**9, 5000)
    assert 0 < plan.crossover.margin < 1.5e-5
    assert plan.active is Mode.EB and not plan.switched
    # MB clearly better: switch
    plan = p.plan(estimate(), cost_with_mixing(-2e-5), 10**9, 5000)
    assert plan.crossover.margin > 1.5e-5
    assert plan.active is Mode.MB and plan.switched


def test_cooldown_holds_mode_after_switch() -> None:
    p = ThresholdPlanner(PlannerConfig(max_num_seqs=1024, cooldown=2, delta=5e-6))
    assert p.plan(estimate(), cost_with_mixing(1e-4), 10**9, 5000).switched
    for _ in range(2):
        plan = p.plan(estimate(), cost_with_mixing(-2e-5), 10**9, 5000)
        assert plan.active is Mode.EB and plan.reason.startswith("hold: cooldown")
    assert p.plan(estimate(), cost_with_mixing(-2e-5), 10**9, 5000).active is Mode.MB


def test_plan_round_trips_through_json() -> None:
    p = ThresholdPlanner(PlannerConfig(max_num_seqs=1024))
    plan = p.plan(estimate(eta=1e-6), cost_with_mixing(1e-4), 10**9, 5000)
    adapter = TypeAdapter(Plan)
    assert adapter.validate_json(adapter.dump_json(plan)) == plan


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("eps", 0.0),
        ("n_star_method", "magic"),
        ("max_num_seqs", 1),
        ("theta_min", 0.9),
        ("cold_workloads", [[512, 0]]),
        ("cold_workloads", [[512]]),
        ("kv_backoff_tolerance", -0.1),
        ("kv_backoff_full", -1.0),
        ("n_settle", 0.0),
    ],
)
def test_config_rejects_bad_values(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        PlannerConfig(**{field: value})


# -- cold start: before the first estimate ------------------------------------------------------


def shipped(name: str) -> tuple[CostModel, int]:
    from ebplus.controller.cost_model import resolve_profile

    prof = resolve_profile(name)
    return prof.cost_model(), prof.kv_capacity_tokens


@pytest.mark.parametrize("n_obs", [512.0, 2048.0])
def test_cold_choice_leaves_mb_when_eb_wins_whatever_the_workload(n_obs: float) -> None:
    """RTX PRO 6000 (bandwidth-limited) at high concurrency: EB wins on each of the paper's workloads."""
    cost, kv = shipped("rtx-pro-6000")
    p = ThresholdPlanner(PlannerConfig(max_num_seqs=2048))
    reason = p.cold_choice(cost, kv, n_obs)
    assert reason is not None and reason.startswith("cold: EB wins on all 4")
    assert p.state.active is Mode.EB and p.last is None
    assert p.cold_update(Mode.AUTO).active is Mode.EB
    assert p.cold_choice(cost, kv, n_obs) is None  # decided: nothing more until the first estimate


def test_cold_choice_each_workload_is_planned_like_a_first_estimate() -> None:
    """The rule is exactly: EB beats MB by the band on every prior workload, as plan() would see it."""
    cost, kv = shipped("rtx-pro-6000")
    cfg = PlannerConfig(max_num_seqs=2048)
    for n_obs in (16.0, 32.0, 64.0, 128.0, 512.0, 2048.0):
        wins = []
        for mu_l, mu_o in cfg.cold_workloads:
            first = ThresholdPlanner(cfg)
            plan = first.plan(Estimate.geometric(mu_l, mu_o, method="test"), cost, kv, n_obs)
            band = cfg.delta_rel / (plan.crossover.tp_mb * (mu_l + mu_o))
            wins.append(plan.crossover.margin < -band)
        assert (ThresholdPlanner(cfg).cold_choice(cost, kv, n_obs) is not None) == all(wins), n_obs


def test_cold_choice_keeps_mb_when_the_workload_decides() -> None:
    """RTX PRO 6000 at c = 32: MB wins for some workloads, so the cold MB stays."""
    cost, kv = shipped("rtx-pro-6000")
    p = ThresholdPlanner(PlannerConfig(max_num_seqs=2048))
    assert p.cold_choice(cost, kv, 32.0) is None and p.state.active is Mode.MB


@pytest.mark.parametrize(
    ("config", "n_obs", "planned"),
    [
        (PlannerConfig(max_num_seqs=2048, cold_workloads=()), 2048.0, False),  # disabled
        (PlannerConfig(max_num_seqs=2048), 8.0, False),  # below min_concurrency
        (PlannerConfig(max_num_seqs=2048), 2048.0, True),  # an estimate exists: plan() decides
    ],
)
def test_cold_choice_only_applies_cold_and_busy(config: PlannerConfig, n_obs: float, planned: bool) -> None:
    cost, kv = shipped("rtx-pro-6000")
    p = ThresholdPlanner(config)
    if planned:
        p.plan(estimate(), cost, kv, 8.0)  # a plan held in MB (low concurrency)
    assert p.cold_choice(cost, kv, n_obs) is None
    assert p.state.active is Mode.MB
