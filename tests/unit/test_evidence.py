"""The closed loop of the EB/MB choice: per-mode evidence, its bias, exploration, attribution."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from factories import batch, registration

from ebplus.controller.config import ControllerConfig, LoopConfig, PlannerConfig
from ebplus.controller.cost_model import CostModel
from ebplus.controller.estimator import Estimate
from ebplus.controller.evidence import ModeEvidence, OperatingPoint
from ebplus.controller.fleet import FleetController
from ebplus.controller.messages import CompletionRecord, FinishReason, Mode, StepRecord, ThresholdUpdate
from ebplus.controller.planner import ThresholdPlanner

COST = CostModel(alpha_p=1e-3, beta_p=2.5e-5, alpha_d=6e-3, beta_d=3e-5, beta_mb=(2.5e-5, 1e-5, 5e-6), alpha_mb=1e-3)


def eb_steps(cycles: int, scale: float = 1.0, switch_s: float = 0.0, n: int = 600) -> list[StepRecord]:
    """EB cycles: a prefill step admitting 30 requests, then 20 decode steps; ``switch_s`` added per phase switch."""
    out = []
    for _ in range(cycles):
        out.append(StepRecord(30 * 512, 0, n, 0, scale * COST.step_seconds(30 * 512, 0) + switch_s))
        for i in range(20):
            extra = switch_s if i == 0 else 0.0
            out.append(StepRecord(0, n, n, 0, scale * COST.step_seconds(0, n) + extra))
    return out


def mb_steps(count: int, scale: float = 1.0, n: int = 600, cost: CostModel = COST) -> list[StepRecord]:
    """MB steps: every fourth carries a prompt chunk."""
    return [
        StepRecord(512 if i % 4 == 0 else 0, n, n, 0, scale * cost.step_seconds(512 if i % 4 == 0 else 0, n))
        for i in range(count)
    ]


def test_bias_is_measured_over_model_time_of_the_same_steps() -> None:
    ev = ModeEvidence(window=4096, min_steps=32, min_phases=4)
    ev.observe(Mode.MB, mb_steps(100), plan=1)
    ev.observe(Mode.EB, eb_steps(10, scale=1.25), plan=1)
    assert ev.measure(Mode.MB, COST).bias == pytest.approx(1.0)
    eb = ev.measure(Mode.EB, COST)
    assert eb.bias == pytest.approx(1.25)
    assert eb.tokens_per_s == pytest.approx(eb.model_tokens_per_s / 1.25)
    assert eb.running == pytest.approx(600)


def test_a_switch_cost_the_model_lacks_shows_as_eb_bias() -> None:
    """Paid twice a cycle, outside any step-cost term: only the measured ratio sees it."""
    ev = ModeEvidence()
    ev.observe(Mode.EB, eb_steps(20, switch_s=0.01), plan=1)
    cycle = COST.step_seconds(30 * 512, 0) + 20 * COST.step_seconds(0, 600)
    assert ev.measure(Mode.EB, COST).bias == pytest.approx((cycle + 0.02) / cycle)


def test_evidence_needs_enough_steps_and_for_eb_enough_phases() -> None:
    ev = ModeEvidence(window=4096, min_steps=32, min_phases=4)
    ev.observe(Mode.MB, mb_steps(31), plan=1)
    assert ev.measure(Mode.MB, COST) is None
    ev.observe(Mode.MB, mb_steps(1), plan=2)
    assert ev.measure(Mode.MB, COST) is not None
    ev.observe(Mode.EB, eb_steps(3), plan=2)  # 63 steps but 3 phases
    assert ev.measure(Mode.EB, COST) is None
    mark = ev.mark(Mode.EB)
    ev.observe(Mode.EB, eb_steps(1), plan=3)
    assert ev.measure(Mode.EB, COST) is not None
    assert not ev.enough_since(Mode.EB, mark)  # one phase since the mark
    with pytest.raises(ValueError, match="eb and mb"):
        ev.observe(Mode.AUTO, mb_steps(1), plan=1)


def test_the_ring_keeps_the_newest_steps() -> None:
    ev = ModeEvidence(window=64, min_steps=32)
    ev.observe(Mode.MB, mb_steps(64, scale=2.0), plan=1)
    ev.observe(Mode.MB, mb_steps(64, scale=1.0), plan=2)
    m = ev.measure(Mode.MB, COST)
    assert m.steps == 64 and m.bias == pytest.approx(1.0) and m.plan == 2


def test_operating_point_nearness() -> None:
    here = OperatingPoint(500, 512, 256)
    assert here.near(OperatingPoint(200, 600, 200), 4.0)
    assert not here.near(OperatingPoint(100, 512, 256), 4.0)
    assert here.near(OperatingPoint(100, 0, 0), 6.0)  # unknown lengths: compared on load only


# -- the planner ---------------------------------------------------------------


def estimate() -> Estimate:
    return Estimate.geometric(512.0, 256.0, method="test")


def planner(**loop: object) -> ThresholdPlanner:
    return ThresholdPlanner(PlannerConfig(max_num_seqs=1024, cooldown=0, loop=LoopConfig(**loop)))


def eb_favoured() -> CostModel:
    """Cheap prefill phases: the model predicts EB well ahead of MB at N = 600."""
    return COST.model_copy(update={"beta_mb": (4e-5, 1e-5, 5e-6)})


def test_a_measured_switch_cost_overturns_the_models_choice() -> None:
    """The model prefers EB at 32 running requests; EB's cycles measure 20 ms more than their steps
    (a phase-switch cost the step model lacks): charged per cycle, MB wins once corrected."""
    ev = ModeEvidence()
    ev.observe(Mode.MB, mb_steps(200, n=32, cost=eb_favoured()), plan=0)
    p = planner()
    first = p.plan(estimate(), eb_favoured(), 10**9, 32, evidence=ev)
    assert first.active is Mode.EB and first.crossover.winner.value == "EB"
    ev.observe(Mode.EB, eb_steps(40, switch_s=0.01, n=32), plan=1)  # paid twice a cycle
    after = p.plan(estimate(), eb_favoured(), 10**9, 32, evidence=ev)
    assert after.active is Mode.MB and after.switched
    eb, mb = after.judgement.eb, after.judgement.mb
    assert eb.measured.excess_per_phase == pytest.approx(0.02) and mb.bias == pytest.approx(1.0)
    assert eb.corrected > eb.predicted and f"measured bias eb x{eb.bias:.3f}" in after.reason
    assert after.k > first.k  # a cost paid once a cycle moves theta* up: fewer, longer cycles
    # the open loop keeps trusting the model
    p_open = planner(enabled=False)
    p_open.plan(estimate(), eb_favoured(), 10**9, 32, evidence=ev)
    assert p_open.plan(estimate(), eb_favoured(), 10**9, 32, evidence=ev).active is Mode.EB


def test_a_thin_margin_and_no_evidence_explore_the_other_mode_once() -> None:
    ev = ModeEvidence()
    ev.observe(Mode.MB, mb_steps(200), plan=0)
    p = planner(explore_below=0.5)  # the model's preference for MB is thin
    plan = p.plan(estimate(), COST, 10**9, 600, evidence=ev, explore=True)
    assert plan.active is Mode.EB and plan.switched and plan.reason.startswith("explore eb: no evidence")
    assert p.state.explorations == 1 and plan.judgement.exploring is Mode.EB
    held = p.plan(estimate(), COST, 10**9, 600, evidence=ev, explore=True)
    assert held.active is Mode.EB and not held.switched and "measuring (0/32 steps)" in held.reason
    ev.observe(Mode.EB, eb_steps(4), plan=2)  # the sample: EB priced right, so MB (the model's choice) stands
    back = p.plan(estimate(), COST, 10**9, 600, evidence=ev, explore=True)
    assert back.active is Mode.MB and back.switched and back.reason.startswith("explored eb, back to mb")
    for _ in range(20):  # evidence of both: never again at this load
        assert not p.plan(estimate(), COST, 10**9, 600, evidence=ev, explore=True).switched
    assert p.state.explorations == 1


def test_exploration_only_where_the_replica_follows_and_the_margin_is_thin() -> None:
    ev = ModeEvidence()
    ev.observe(Mode.MB, mb_steps(200), plan=0)
    assert not planner(explore_below=0.5).plan(estimate(), COST, 10**9, 600, evidence=ev).switched  # explore=False
    sure = planner(explore_below=0.01)
    assert not sure.plan(estimate(), COST, 10**9, 600, evidence=ev, explore=True).switched
    never = planner(explore_below=0.0)
    assert not never.plan(estimate(), COST, 10**9, 600, evidence=ev, explore=True).switched


def test_an_exploration_that_confirms_the_other_mode_stays_there() -> None:
    ev = ModeEvidence()
    ev.observe(Mode.MB, mb_steps(200, scale=1.3), plan=0)  # MB measured 30% slower than modelled
    p = planner(explore_below=0.5, enabled=True)
    p.state.active = Mode.MB
    # with MB's bias the corrected margin already favours EB: a plain switch, no exploration needed
    assert p.plan(estimate(), COST, 10**9, 600, evidence=ev, explore=True).reason.startswith("switch to eb")


# -- the fleet: which mode a push's steps ran under -----------------------------


def _completions(n: int, start: int = 0) -> list[CompletionRecord]:
    rng = np.random.default_rng(start)
    return [
        CompletionRecord(512, int(o), FinishReason.STOP, seq=start + i) for i, o in enumerate(rng.geometric(1 / 256, n))
    ]


def test_steps_count_for_a_mode_only_once_the_replica_runs_it() -> None:
    fc = FleetController(ControllerConfig(first_update=30), clock=lambda: 0.0)
    fc.register(registration("r", Mode.AUTO, 2_000_000, 1024, COST))
    ev = fc.replicas["r"].evidence
    fc.ingest(batch("r", (), mb_steps(40), applied_version=0))  # before its first report: not known
    assert ev.mark(Mode.MB)[0] == 0
    fc.ingest(batch("r", (), mb_steps(40), applied_version=0))  # runs the registration's MB
    assert ev.mark(Mode.MB)[0] == 40
    fc.replicas["r"].current = ThresholdUpdate(mode=Mode.AUTO, k=10, n=1024, version=5, active=Mode.EB)
    fc.replicas["r"].active_since = 5
    fc.ingest(batch("r", (), eb_steps(2), applied_version=5))  # sent before the push that said 5: straddles
    assert ev.mark(Mode.EB)[0] == 0 and ev.mark(Mode.MB)[0] == 40
    fc.ingest(batch("r", (), eb_steps(2), applied_version=5))
    assert ev.mark(Mode.EB)[0] == 42


def test_shadow_plans_like_auto_runs_mb_and_shows_the_choice() -> None:
    """Shadow: the planned choice is published (planned), the replica runs MB, nothing is explored."""
    fc = FleetController(ControllerConfig(first_update=30), clock=lambda: 0.0)
    fc.register(registration("r", Mode.SHADOW, 2_000_000, 1024, eb_favoured()))
    steps = [StepRecord(0, 600, 600, 0, 0.03)] * 40
    fc.ingest(batch("r", (), steps, applied_version=0))
    fc.ingest(batch("r", _completions(30), steps, applied_version=0))
    view = fc.snapshot().replicas["r"]
    assert view.mode is Mode.SHADOW and view.active is Mode.MB
    assert view.planned is Mode.EB and fc.replicas["r"].current.active is Mode.MB
    assert fc.replicas["r"].evidence.mark(Mode.EB) == (0, 0) and view.explorations == 0
    assert view.judgement is not None and view.judgement.mb.measured is not None


def test_a_ledger_prices_only_its_new_steps_and_gets_the_whole_pricing_to_the_last_bit() -> None:
    """What a plan reads (the steps' seconds under its cost model) is priced a push at a time; a ring that
    wraps, and a cost model that changes (a refit), give what pricing the whole ring at once gives."""
    from ebplus.controller.evidence import _Ledger

    rng = np.random.default_rng(11)
    ledger = _Ledger(100)
    models = [CostModel(alpha_p=1e-3 * (1 + i), beta_p=2e-5, alpha_d=8e-3, beta_d=4e-5, beta_mb=(2e-5, 5e-5, 1e-5),
                        beta_kv=1e-9 * i) for i in range(3)]  # fmt: skip
    for push in range(40):
        kinds = rng.integers(0, 3, int(rng.integers(1, 30)))
        records = [StepRecord(int(p) * (k != 1), int(d) * (k != 0), 10, 0, 0.01, int(kv))
                   for k, p, d, kv in zip(kinds, rng.integers(1, 4000, kinds.size), rng.integers(1, 500, kinds.size),
                                          rng.integers(0, 10**5, kinds.size), strict=True)]  # fmt: skip
        ledger.add(records)
        cost = models[push // 15]
        held = ledger.view()
        whole = cost.steps_seconds(held[:, 0], held[:, 1], held[:, 2])
        assert ledger.model_seconds(cost).tolist() == whole.tolist()
    assert ledger.total > 100 and ledger.size == 100


@pytest.mark.parametrize("capacity", [1, 7, 64])
def test_a_ledger_prices_pushes_longer_than_its_ring_and_a_new_model_to_the_last_bit(capacity: int) -> None:
    """The rows a plan has not priced are the newest, at most a ring of them: pushes that wrap the ring, fill it
    more than once, or come several between two plans, and a refit's new model, all price as the whole ring."""
    from ebplus.controller.evidence import _Ledger

    rng = np.random.default_rng(capacity)
    ledger = _Ledger(capacity)
    models = [CostModel(alpha_p=1e-3, beta_p=2e-5 * (1 + i), alpha_d=8e-3, beta_d=4e-5, beta_mb=(2e-5, 5e-5, 1e-5),
                        beta_kv=1e-9 * i) for i in range(2)]  # fmt: skip
    for plan in range(60):
        for _ in range(int(rng.integers(0, 3))):  # pushes between two plans
            n = int(rng.integers(0, 3 * capacity + 2))
            ledger.add([StepRecord(int(rng.integers(0, 3)) * 300, int(rng.integers(1, 3)) * 20, 9, 0,
                                   float(rng.random()) + 0.01, int(rng.integers(0, 10**4))) for _ in range(n)])  # fmt: skip
        cost = models[(plan // 7) % 2]
        held = ledger.view()
        assert ledger.model_seconds(cost).tolist() == cost.steps_seconds(held[:, 0], held[:, 1], held[:, 2]).tolist()
        assert (ledger.rows[: ledger.size] == held).all() and ledger.held().shape == (6, ledger.size)


def _steps(rng: np.random.Generator, n: int) -> list[StepRecord]:
    kinds = rng.integers(0, 3, n)
    return [StepRecord(int(p) * (k != 1), int(d) * (k != 0), 10, 0, float(s), int(kv))
            for k, p, d, s, kv in zip(kinds, rng.integers(1, 4000, n), rng.integers(1, 500, n), rng.random(n) + 0.01,
                                      rng.integers(0, 10**5, n), strict=True)]  # fmt: skip


def test_pricing_the_fleet_at_once_gives_each_replica_its_own_models_prices_to_the_last_bit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Replicas of different models priced in one pass: each ledger holds the prices its own model gives, and a
    plan measuring with that model prices nothing again; a plan with another model (a refit) prices it all."""
    from ebplus.controller.evidence import price_fleet

    rng = np.random.default_rng(5)
    models = [CostModel(alpha_p=1e-3 * (1 + i), beta_p=2e-5, alpha_d=8e-3 / (1 + i), beta_d=4e-5 * (1 + i),
                        beta_mb=(2e-5, 5e-5 * i, 1e-5), alpha_mb=None if i else 3e-3, beta_kv=1e-9 * i)
              for i in range(3)]  # fmt: skip
    fleet = [ModeEvidence(window=w) for w in (5, 64, 200, 64)]
    priced_alone = []
    steps_seconds = CostModel.steps_seconds
    monkeypatch.setattr(CostModel, "steps_seconds", lambda *a: priced_alone.append(1) or steps_seconds(*a))
    for update in range(40):
        for ev in fleet:
            for _ in range(int(rng.integers(0, 3))):
                ev.observe(Mode.EB if rng.random() < 0.5 else Mode.MB, _steps(rng, int(rng.integers(0, 90))), update)
        books = [(ev, models[(i + update // 6) % 3]) for i, ev in enumerate(fleet)]
        price_fleet(books[: update % 4 + 1])  # some priced fleet-wide, the rest left to their plans
        for i, (ev, cost) in enumerate(books):
            for ledger in ev._ledgers.values():
                priced_alone.clear()
                held = ledger.view()
                got = ledger.model_seconds(cost).tolist()
                assert got == steps_seconds(cost, held[:, 0], held[:, 1], held[:, 2]).tolist()
                if i <= update % 4:
                    assert not priced_alone
                assert ledger.model_seconds(models[(i + update // 6 + 1) % 3]).tolist() == steps_seconds(
                    models[(i + update // 6 + 1) % 3], held[:, 0], held[:, 1], held[:, 2]).tolist()  # fmt: skip
                assert ledger.model_seconds(cost).tolist() == got


def test_an_operating_point_is_near_another_coordinate_by_coordinate() -> None:
    """Each coordinate within the factor, those not > 0 on both sides skipped (NaN included)."""
    values = (0.0, -1.0, 1.0, 1.4, 2.0, 3.0, float("nan"), float("inf"))
    for a, b, c in itertools.product(values, repeat=3):
        p, q = OperatingPoint(a, b, c), OperatingPoint(1.5, 1.5, 1.5)
        for x, y in ((p, q), (q, p)):
            pairs = ((x.running, y.running), (x.mu_l, y.mu_l), (x.mu_o, y.mu_o))
            expected = all(u / 1.5 <= v <= u * 1.5 for u, v in pairs if u > 0 and v > 0)
            assert x.near(y, 1.5) is expected


def test_the_lengths_median_is_statistics_median() -> None:
    import statistics

    from ebplus.controller.evidence import _median_of

    rng = np.random.default_rng(2)
    for n in range(1, 10):
        for _ in range(200):
            values = tuple(float(x) for x in rng.choice([0.5, 1.0, 512.0, 255.3, rng.random() * 1e3], n))
            assert _median_of(values) == statistics.median(values)
