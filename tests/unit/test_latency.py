"""Latency of each mode from the closed forms, the latency-aware k, and the SLO-aware mode choice."""

from __future__ import annotations

import itertools

import pytest

from ebplus.controller import latency, theory
from ebplus.controller.config import LoopConfig, PlannerConfig, SloConfig
from ebplus.controller.cost_model import resolve_profile
from ebplus.controller.estimator import Estimate
from ebplus.controller.evidence import ModeEvidence
from ebplus.controller.messages import CompletionRecord, FinishReason, Mode
from ebplus.controller.planner import ThresholdPlanner

H200 = resolve_profile("h200").cost_model().folded(512 + 256)
MU_L, MU_O, BUDGET = 512.0, 256.0, 8192.0


def test_stall_and_ttft_grow_with_k_while_throughput_is_flat() -> None:
    lats = [latency.eb_latency(k, 1024, H200, MU_L, MU_O, BUDGET) for k in (10, 40, 100, 200)]
    assert all(a.stall < b.stall and a.ttft_p99 < b.ttft_p99 for a, b in itertools.pairwise(lats))
    args = (H200.alpha_p, H200.alpha_d, H200.beta_p, H200.beta_d, MU_L, MU_O, BUDGET)
    tps = [theory.tp_eb(k, 1024, *args) for k in (10, 40, 100, 200)]
    assert max(tps) / min(tps) < 1.03  # the H200 figures: 28.74k..28.87k tok/s


def test_without_targets_k_is_the_smallest_stall_within_the_tolerance() -> None:
    k_star = 60
    pick = latency.choose_k(k_star, 1024, H200, MU_L, MU_O, BUDGET, SloConfig(tolerance=0.01))
    assert pick.k < k_star and pick.meets is None and pick.bound == latency.PrefillBound()
    assert pick.throughput >= 0.99 * pick.best_throughput
    looser = latency.choose_k(k_star, 1024, H200, MU_L, MU_O, BUDGET, SloConfig(tolerance=0.05))
    assert looser.k <= pick.k and looser.latency.stall <= pick.latency.stall


def test_a_stall_target_cuts_prefill_runs_to_fit_with_the_safety_margin() -> None:
    slo = SloConfig(max_stall_s=0.2, safety=0.25)
    bound = latency.prefill_bound(H200, 40, 1024, MU_L, BUDGET, slo)
    assert bound.steps >= 1
    lat = latency.eb_latency(40, 1024, H200, MU_L, MU_O, BUDGET, bound=bound)
    assert lat.stall <= 0.75 * 0.2 + 1e-9
    # a target below one full-budget step: one smaller step per run
    full = H200.alpha_p + H200.beta_p * BUDGET
    tight = latency.prefill_bound(H200, 40, 1024, MU_L, BUDGET, SloConfig(max_stall_s=full, safety=0.25))
    assert tight.steps == 1 and latency.MIN_PREFILL_TOKENS <= tight.tokens < BUDGET
    unbounded = latency.eb_latency(40, 1024, H200, MU_L, MU_O, BUDGET)
    assert latency.eb_latency(40, 1024, H200, MU_L, MU_O, BUDGET, bound=tight).stall < unbounded.stall


def test_targets_pick_the_k_with_the_most_margin() -> None:
    slo = SloConfig(ttft_p99_s=0.5, tolerance=0.01, safety=0.0)
    pick = latency.choose_k(60, 1024, H200, MU_L, MU_O, BUDGET, slo)
    assert pick.meets and pick.latency.ttft_p99 <= 0.5
    impossible = latency.choose_k(60, 1024, H200, MU_L, MU_O, BUDGET, SloConfig(ttft_p99_s=1e-4, safety=0.0))
    assert impossible.meets is False and "no k meets" in impossible.reason


def estimate() -> Estimate:
    return Estimate.geometric(MU_L, MU_O, method="test")


def test_a_mode_predicted_to_miss_the_targets_loses_to_one_that_meets_them() -> None:
    """Costly prefill steps (0.3 s each): EB holds on throughput, but no prefill run fits a 0.4 s stall target."""
    cost = resolve_profile("h200").cost_model().model_copy(update={"alpha_p": 0.3, "alpha_mb": 0.012})
    free = ThresholdPlanner(PlannerConfig(max_num_seqs=2048, cooldown=0))
    free.state.active = Mode.EB
    assert free.plan(estimate(), cost, 10**9, 2048).active is Mode.EB
    tight = ThresholdPlanner(PlannerConfig(max_num_seqs=2048, cooldown=0, slo=SloConfig(max_stall_s=0.4)))
    tight.state.active = Mode.EB
    plan = tight.plan(estimate(), cost, 10**9, 2048)
    assert plan.judgement.eb.meets is False and plan.judgement.mb.meets is True
    assert plan.active is Mode.MB and plan.switched
    assert plan.prefill_steps == 1 and plan.prefill_tokens == latency.MIN_PREFILL_TOKENS  # the least it can do


def test_what_the_requests_saw_overrides_the_prediction() -> None:
    """MB is predicted to meet the TTFT target, but its requests measured 3x it: EB (predicted to meet) wins."""
    cost = resolve_profile("h200").cost_model()
    slo = SloConfig(ttft_p99_s=2.0, safety=0.0)
    p = ThresholdPlanner(PlannerConfig(max_num_seqs=2048, cooldown=0, slo=slo, loop=LoopConfig(explore_below=0)))
    ev = ModeEvidence(min_completions=100)
    ev.observe_completions(Mode.MB, [CompletionRecord(512, 256, FinishReason.STOP, ttft_s=6.0, stall_s=0.05)] * 200)
    plan = p.plan(estimate(), cost, 10**9, 2048, evidence=ev)
    mb = plan.judgement.mb
    assert mb.latency_measured is not None and mb.latency.ttft_p99 == pytest.approx(6.0) and mb.meets is False
    assert plan.judgement.eb.latency_measured is None and plan.active is Mode.EB


@pytest.mark.parametrize("n", [2, 3, 49, 50, 1024])
def test_the_candidate_grid_is_the_log_spaced_thresholds(n: int) -> None:
    import numpy as np

    expected = sorted({int(k) for k in np.unique(np.round(np.geomspace(1, n - 1, min(latency.CANDIDATES, n - 1))))})
    assert list(latency._grid(n)) == expected


@pytest.mark.parametrize("n", [2, 3, 49, 50, 1024])
def test_the_candidates_are_the_grid_with_k_star_in_its_place(n: int) -> None:
    for k_star in {1, n // 2, max(1, n - 1), *latency._grid(n)}:
        assert latency._candidates(n, k_star) == sorted({*latency._grid(n), k_star})


def test_the_price_book_answers_each_set_of_arguments_as_the_closed_forms_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan's book prices EB and MB once per set of arguments: any argument that differs is priced anew."""
    calls: list[tuple] = []
    tp_eb, mb_steps = theory.tp_eb, theory.mb_steps
    monkeypatch.setattr(theory, "tp_eb", lambda *a: calls.append(("eb", *a)) or tp_eb(*a))
    monkeypatch.setattr(theory, "mb_steps", lambda *a: calls.append(("mb", *a)) or mb_steps(*a))
    book = latency.Prices()
    args = (40, 1024, H200.alpha_p, H200.alpha_d, H200.beta_p, H200.beta_d, MU_L, MU_O, BUDGET, 0.0)
    assert book.tp_eb(*args) == tp_eb(*args) and book.tp_eb(*args) == tp_eb(*args)
    assert len(calls) == 1
    for i, other in ((0, 41), (1, 1000), (2, 2 * H200.alpha_p), (6, 600.0), (8, None), (8, 4096.0), (9, 1e-3)):
        changed = (*args[:i], other, *args[i + 1 :])
        assert book.tp_eb(*changed) == tp_eb(*changed)
    assert len(calls) == 8
    mb = (1024, H200.alpha_mixed, H200.beta_mb, H200.alpha_d, H200.beta_d, MU_L, MU_O, BUDGET)
    assert book.mb_steps(*mb) == mb_steps(*mb) and book.mb_steps(*mb) is book.mb_steps(*mb)
    assert book.mb_steps(*mb[:-1], None) == mb_steps(*mb[:-1], None)
    assert len(calls) == 10
    book.priced_eb(123.0, *args[:-1], 5e-3)  # a price recorded for one cycle cost is that one's only
    assert book.tp_eb(*args[:-1], 5e-3) == 123.0 and book.tp_eb(*args) == tp_eb(*args) and len(calls) == 10


def test_a_plan_with_its_price_book_is_the_plan_priced_call_by_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The book only spares repeated calls: with one that prices every call afresh, every plan is the same."""

    class NoBook(latency.Prices):
        def tp_eb(self, *args: float) -> float:  # type: ignore[override]
            return theory.tp_eb(*args)

        def mb_steps(self, *args):  # type: ignore[no-untyped-def,override]
            return theory.mb_steps(*args)

    cost = resolve_profile("h200").cost_model()
    configs = [PlannerConfig(max_num_seqs=2048, cooldown=0),
               PlannerConfig(max_num_seqs=1024, slo=SloConfig(ttft_p99_s=2.0, max_stall_s=0.3)),
               PlannerConfig(max_num_seqs=512, slo=SloConfig(ttft_p99_s=1.0, itl_p99_s=0.05, tolerance=0.02))]  # fmt: skip
    for config in configs:
        plans = []
        for book in (latency.Prices, NoBook):
            monkeypatch.setattr(latency, "Prices", book)
            planner = ThresholdPlanner(config)
            ev = ModeEvidence(min_completions=100)
            ev.observe_completions(Mode.MB, [CompletionRecord(512, 256, FinishReason.STOP, ttft_s=1.0, stall_s=0.05)] * 200)
            plans.append([planner.plan(Estimate.geometric(MU_L, mu_o, method="test"), cost, 4e6, n_obs, evidence=ev)
                          for mu_o, n_obs in ((256.0, 2048), (300.0, 700), (120.0, 96), (256.0, 5000))])  # fmt: skip
        assert plans[0] == plans[1]
