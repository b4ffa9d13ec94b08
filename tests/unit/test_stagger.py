"""Staggered prefill windows: the phase machine's timed windows (replicas.phases) and the controller's rule
(controller.stagger), both pure: no vLLM or Ray."""

from __future__ import annotations

import math

import msgspec
import pytest

from ebplus.controller.cost_model import CostModel
from ebplus.controller.estimator import Estimate
from ebplus.controller.messages import Mode, StepKind, ThresholdUpdate
from ebplus.controller.stagger import EbReplica, decide, of_fleet
from ebplus.replicas.phases import EngineView, PhaseMachine


def staggered(period: float = 1.0, phase: float = 0.0, k: int = 4) -> PhaseMachine:
    return PhaseMachine(ThresholdUpdate(mode=Mode.EB, k=k, n=16, stagger_period_s=period, stagger_phase=phase))


# -- the wire ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"stagger_period_s": -1.0}, "stagger_period_s"),
        ({"stagger_period_s": math.inf}, "stagger_period_s"),
        ({"stagger_phase": 1.0}, "stagger_phase"),
        ({"stagger_phase": -0.1}, "stagger_phase"),
    ],
)
def test_threshold_update_rejects_bad_stagger(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ThresholdUpdate(mode=Mode.EB, k=1, n=4, **kwargs)


def test_an_update_without_the_stagger_fields_decodes_as_no_stagger() -> None:
    """A controller that predates the stagger sends neither field: the replica reads "no stagger"."""
    old = msgspec.json.encode({"mode": "eb", "k": 2, "n": 8, "version": 3})
    th = msgspec.json.decode(old, type=ThresholdUpdate)
    assert (th.stagger_period_s, th.stagger_phase) == (0.0, 0.0)
    assert PhaseMachine(th).next_slot(5.0) is None


def test_stagger_fields_round_trip() -> None:
    th = ThresholdUpdate(mode=Mode.EB, k=2, n=8, stagger_period_s=0.5, stagger_phase=0.25)
    assert msgspec.json.decode(msgspec.json.encode(th), type=ThresholdUpdate) == th


# -- the phase machine -------------------------------------------------------


def test_a_slot_opens_a_window_below_k() -> None:
    m = staggered(period=1.0, phase=0.5, k=4)
    # a fresh machine has had no window: its last slot (-0.5) is due, so its first waiting request opens one
    assert m.decide(EngineView(running=8, prefilling=0, waiting=1, now=0.1)).phase is StepKind.PREFILL
    m.decide(EngineView(running=9, prefilling=0, waiting=0, now=0.15))
    assert m.decide(EngineView(running=9, prefilling=0, waiting=1, now=0.2)).phase is StepKind.DECODE
    plan = m.decide(EngineView(running=9, prefilling=0, waiting=1, now=0.5))  # the slot at 0.5
    assert plan.phase is StepKind.PREFILL and plan.max_admit == 1
    assert m.stats.stagger_windows == 2


def test_one_window_a_slot() -> None:
    m = staggered(period=1.0, phase=0.0, k=4)
    m.decide(EngineView(running=8, prefilling=0, waiting=1, now=1.1))  # the slot at 1.0 opens it
    m.decide(EngineView(running=9, prefilling=0, waiting=0, now=1.2))  # nothing left: the window closes
    assert m.decide(EngineView(running=9, prefilling=0, waiting=1, now=1.5)).phase is StepKind.DECODE
    assert m.next_slot(1.5) == pytest.approx(2.0)
    assert m.decide(EngineView(running=9, prefilling=0, waiting=1, now=2.0)).phase is StepKind.PREFILL


def test_a_window_opened_by_k_uses_up_the_slot_before_it() -> None:
    m = staggered(period=1.0, phase=0.0, k=2)
    m.decide(EngineView(running=8, prefilling=0, waiting=2, now=3.4))  # k waiting: a window
    m.decide(EngineView(running=10, prefilling=0, waiting=0, now=3.5))
    assert m.next_slot(3.6) == pytest.approx(4.0)


def test_a_missed_slot_stays_armed_until_a_request_waits() -> None:
    m = staggered(period=1.0, phase=0.0, k=4)
    assert m.decide(EngineView(running=8, prefilling=0, waiting=0, now=1.3)).phase is StepKind.DECODE
    assert m.next_slot(1.3) == 1.3  # due now: the next request opens a window at once
    assert m.decide(EngineView(running=8, prefilling=0, waiting=1, now=1.7)).phase is StepKind.PREFILL


def test_no_timed_windows_without_a_clock_or_a_period() -> None:
    assert staggered(period=1.0).decide(EngineView(running=8, prefilling=0, waiting=1)).phase is StepKind.DECODE
    m = PhaseMachine(ThresholdUpdate(mode=Mode.EB, k=4, n=16))
    assert m.decide(EngineView(running=8, prefilling=0, waiting=1, now=7.0)).phase is StepKind.DECODE


def test_mb_ignores_the_stagger() -> None:
    m = PhaseMachine(ThresholdUpdate(mode=Mode.AUTO, k=4, n=16, active=Mode.MB, stagger_period_s=1.0))
    assert m.decide(EngineView(running=8, prefilling=0, waiting=1, now=0.0)).phase is StepKind.MIXED
    assert m.stats.stagger_windows == 0


# -- the rule ------------------------------------------------------------------


def eb(rid: str, k: int = 8, running: float = 64, mu_o: float = 200, step: float = 0.02) -> EbReplica:
    return EbReplica(rid, k, running, mu_o, step)


def test_cycle_is_k_departures() -> None:
    assert eb("a").cycle_s == pytest.approx(8 * 200 / 64 * 0.02)
    assert math.isnan(eb("a", running=0).cycle_s)


def test_off_for_one_replica_or_none_in_eb() -> None:
    assert not decide("on", [eb("a")], replicas=1).on
    assert not decide("on", [], replicas=4).on  # an all-MB fleet
    assert not decide("on", [eb("a")], replicas=4).on  # one EB replica among MB ones


def test_off_when_configured() -> None:
    off = decide("off", [eb("a"), eb("b")], 2)
    assert not off.on and "configured" in off.reason
    assert off.phase_of("a") is None


def test_no_cycle_no_stagger() -> None:
    assert not decide("on", [eb("a", running=0), eb("b", running=0)], 2).on


def test_on_spreads_phases_in_id_order_over_the_median_cycle() -> None:
    d = decide("on", [eb("c", k=4), eb("a", k=8), eb("b", k=16)], 3)
    assert d.on and d.period_s == pytest.approx(eb("a").cycle_s)
    assert [d.phase_of(r) for r in ("a", "b", "c")] == pytest.approx([0, 1 / 3, 2 / 3])


def test_of_fleet_prices_eb_replicas_only() -> None:
    cost = CostModel(alpha_p=0.01, beta_p=1e-4, alpha_d=0.01, beta_d=1e-4, beta_mb=(1e-4, 0.0, 0.0))
    estimate = Estimate.geometric(mu_l=100, mu_o=200, method="test")
    fleet = [
        ("a", ThresholdUpdate(mode=Mode.EB, k=4, n=32), 16.0, cost),
        ("b", ThresholdUpdate(mode=Mode.EB, k=4, n=32), None, cost),  # no concurrency yet: N
        ("c", ThresholdUpdate(mode=Mode.AUTO, k=4, n=32, active=Mode.MB), 16.0, cost),
    ]
    d = of_fleet("on", fleet, estimate)
    assert d.on and set(d.phases or {}) == {"a", "b"}
    cycles = sorted(4 * 200 / m * cost.step_seconds(0, m, m * 200) for m in (16, 32))
    assert d.period_s == pytest.approx(cycles[1])  # the upper median of two
    assert not of_fleet("on", fleet, None).on
