"""The phase machine (replicas.phases): the policy both the simulator and the vLLM scheduler run."""

from __future__ import annotations

import msgspec
import pytest

from ebplus.controller.messages import Mode, StepKind, ThresholdUpdate
from ebplus.replicas.phases import EngineView, PhaseMachine


def machine(mode: Mode = Mode.EB, k: int = 4, n: int = 16, active: Mode = Mode.MB) -> PhaseMachine:
    return PhaseMachine(ThresholdUpdate(mode=mode, k=k, n=n, active=active))


# -- ThresholdUpdate --------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"k": 0, "n": 4}, "k must be"),
        ({"k": 5, "n": 4}, "k must be"),
        ({"k": 1, "n": 0}, "n must be"),
        ({"k": 1, "n": 4, "version": -1}, "version"),
        ({"k": True, "n": 4}, "k must be"),
        ({"k": 1, "n": 4, "active": "v0"}, "active"),
        ({"k": 1, "n": 4, "prefill_steps": -1}, "prefill_steps"),
        ({"k": 1, "n": 4, "prefill_tokens": 1.5}, "prefill_tokens"),
    ],
)
def test_threshold_update_rejects(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ThresholdUpdate(mode=Mode.AUTO, **kwargs)


@pytest.mark.parametrize(
    ("mode", "active", "expected"),
    [
        ("mb", "eb", Mode.MB),
        ("eb", "mb", Mode.EB),
        ("v0", "mb", Mode.EB),
        ("auto", "eb", Mode.EB),
        ("auto", "mb", Mode.MB),
        ("shadow", "eb", Mode.MB),  # shadow publishes the controller's choice but runs MB
    ],
)
def test_active_implied_by_mode(mode: str, active: str, expected: Mode) -> None:
    th = ThresholdUpdate(mode=mode, k=2, n=8, active=active)
    assert th.active is expected
    assert msgspec.to_builtins(th)["active"] == expected.value  # what travels on the wire


def test_v0_uses_k_one() -> None:
    assert ThresholdUpdate(mode=Mode.V0, k=5, n=8).effective_k == 1
    assert ThresholdUpdate(mode=Mode.EB, k=5, n=8).effective_k == 5


# -- MB ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("view", "phase", "admit"),
    [
        (EngineView(running=10, prefilling=0, waiting=3), StepKind.MIXED, 6),
        (EngineView(running=16, prefilling=0, waiting=3), StepKind.DECODE, 0),
        (EngineView(running=0, prefilling=0, waiting=3), StepKind.PREFILL, 16),
        (EngineView(running=4, prefilling=4, waiting=0), StepKind.PREFILL, 12),
        (EngineView(running=0, prefilling=0, waiting=0), StepKind.IDLE, 16),
        (EngineView(running=20, prefilling=0, waiting=3), StepKind.DECODE, 0),  # N lowered below running
    ],
)
def test_mb_always_allows_both(view: EngineView, phase: StepKind, admit: int) -> None:
    plan = machine(Mode.MB).decide(view)
    assert (plan.phase, plan.decode, plan.prefill, plan.max_admit) == (phase, True, True, admit)


def test_mb_ignores_head_fits() -> None:
    plan = machine(Mode.MB).decide(EngineView(running=4, prefilling=0, waiting=3, head_fits=False))
    assert plan.prefill and plan.max_admit == 12


# -- EB ---------------------------------------------------------------------


def test_eb_decodes_until_k_slots_free_then_refills_to_n() -> None:
    m = machine(Mode.EB, k=4, n=16)
    # cold start: nothing decoding, requests waiting -> prefill at once
    plan = m.decide(EngineView(running=0, prefilling=0, waiting=40))
    assert (plan.phase, plan.decode, plan.max_admit) == (StepKind.PREFILL, False, 16)
    m.observe(admitted=16, prefill_tokens=1000, running_after=16)
    # all admitted and prompts done: nothing more to admit -> decode
    plan = m.decide(EngineView(running=16, prefilling=0, waiting=24))
    assert (plan.phase, plan.prefill, plan.max_admit) == (StepKind.DECODE, False, 0)
    # 3 free slots < k: keep decoding
    assert m.decide(EngineView(running=13, prefilling=0, waiting=24)).phase is StepKind.DECODE
    # 4 free slots == k: prefill phase refilling exactly the free slots
    plan = m.decide(EngineView(running=12, prefilling=0, waiting=24))
    assert (plan.phase, plan.max_admit) == (StepKind.PREFILL, 4)
    m.observe(admitted=2, prefill_tokens=64, running_after=14)
    # chunked prefill continues; the rest is admitted in the same phase
    plan = m.decide(EngineView(running=14, prefilling=1, waiting=22))
    assert (plan.phase, plan.max_admit) == (StepKind.PREFILL, 2)
    assert m.stats.prefill_phases == 2
    assert m.stats.phase_switches == 3


def test_eb_prefill_when_nothing_decodes_even_below_k() -> None:
    m = machine(Mode.EB, k=8, n=16)
    plan = m.decide(EngineView(running=0, prefilling=0, waiting=2))
    assert (plan.phase, plan.max_admit) == (StepKind.PREFILL, 2)


def test_eb_light_load_threshold_is_on_admissible_requests() -> None:
    m = machine(Mode.EB, k=4, n=16)
    m.decide(EngineView(running=0, prefilling=0, waiting=6))
    m.observe(6, 600, 6)
    assert m.decide(EngineView(running=6, prefilling=0, waiting=0)).phase is StepKind.DECODE
    # 10 free slots but only 3 waiting: not yet k admissible requests
    assert m.decide(EngineView(running=6, prefilling=0, waiting=3)).phase is StepKind.DECODE
    assert m.decide(EngineView(running=6, prefilling=0, waiting=4)).phase is StepKind.PREFILL


def test_eb_drain_admits_stragglers_once_k_slots_freed() -> None:
    # fewer than k requests wait and no more arrive (the end of a burst): they must not
    # wait for the whole batch to finish, only for k completions since the refill
    m = machine(Mode.EB, k=4, n=16)
    m.decide(EngineView(running=0, prefilling=0, waiting=18))
    m.observe(16, 1600, 16)
    assert m.decide(EngineView(running=16, prefilling=0, waiting=2)).phase is StepKind.DECODE
    assert m.decide(EngineView(running=13, prefilling=0, waiting=2)).phase is StepKind.DECODE  # 3 freed < k
    plan = m.decide(EngineView(running=12, prefilling=0, waiting=2))
    assert (plan.phase, plan.max_admit) == (StepKind.PREFILL, 2)
    m.observe(2, 200, 14)
    assert m.decide(EngineView(running=14, prefilling=0, waiting=0)).phase is StepKind.DECODE
    # the count restarts at the new refill (14 running); one more request arrives
    assert m.decide(EngineView(running=14, prefilling=0, waiting=1)).phase is StepKind.DECODE
    assert m.decide(EngineView(running=11, prefilling=0, waiting=1)).phase is StepKind.DECODE
    assert m.decide(EngineView(running=10, prefilling=0, waiting=1)).phase is StepKind.PREFILL


def test_eb_freed_count_starts_at_a_kv_backoff() -> None:
    m = machine(Mode.EB, k=3, n=16)
    m.phase = StepKind.DECODE
    assert m.decide(EngineView(running=10, prefilling=0, waiting=2)).phase is StepKind.DECODE
    m.decide(EngineView(running=10, prefilling=0, waiting=3))
    m.observe(admitted=0, prefill_tokens=0, running_after=10)  # no blocks: back off at 10 running
    assert m.decide(EngineView(running=8, prefilling=0, waiting=2)).phase is StepKind.DECODE  # 2 freed
    assert m.decide(EngineView(running=7, prefilling=0, waiting=2)).phase is StepKind.PREFILL  # 3 freed


def test_eb_freed_count_not_carried_over_mb_steps() -> None:
    m = machine(Mode.AUTO, k=4, n=16, active=Mode.EB)
    m.decide(EngineView(running=0, prefilling=0, waiting=16))
    m.observe(16, 1600, 16)
    m.decide(EngineView(running=16, prefilling=0, waiting=0))  # refilled to 16
    m.apply(ThresholdUpdate(mode=Mode.AUTO, k=4, n=16, active=Mode.MB))
    m.decide(EngineView(running=16, prefilling=0, waiting=0))
    m.apply(ThresholdUpdate(mode=Mode.AUTO, k=4, n=16, active=Mode.EB))
    # 6 fewer running than at the EB refill, but MB steps ran since: only admissible >= k counts
    assert m.decide(EngineView(running=10, prefilling=0, waiting=2)).phase is StepKind.DECODE


def test_eb_running_prefill_chunks_pull_into_prefill_phase() -> None:
    m = machine(Mode.EB, k=4, n=16)
    m.phase = StepKind.DECODE
    plan = m.decide(EngineView(running=5, prefilling=1, waiting=0))
    assert (plan.phase, plan.decode, plan.prefill) == (StepKind.PREFILL, False, True)


def test_eb_idle_when_nothing_to_do() -> None:
    plan = machine(Mode.EB).decide(EngineView(running=0, prefilling=0, waiting=0))
    assert (plan.phase, plan.decode, plan.prefill) == (StepKind.IDLE, False, False)


def test_v0_prefills_as_soon_as_one_slot_is_free() -> None:
    m = machine(Mode.V0, k=4, n=4)
    m.decide(EngineView(running=0, prefilling=0, waiting=9))
    m.observe(4, 100, 4)
    assert m.decide(EngineView(running=4, prefilling=0, waiting=5)).phase is StepKind.DECODE
    assert m.decide(EngineView(running=3, prefilling=0, waiting=5)).phase is StepKind.PREFILL


def test_apply_governs_next_decision() -> None:
    m = machine(Mode.AUTO, k=4, n=16, active=Mode.MB)
    view = EngineView(running=10, prefilling=0, waiting=3)
    assert m.decide(view).phase is StepKind.MIXED
    m.apply(ThresholdUpdate(mode=Mode.AUTO, k=2, n=12, active=Mode.EB, version=7))
    plan = m.decide(view)
    assert (plan.phase, plan.max_admit) == (StepKind.PREFILL, 2)
    assert m.thresholds.version == 7


# -- KV back-off --------------------------------------------------------------


def test_reactive_backoff_until_a_request_finishes() -> None:
    m = machine(Mode.EB, k=2, n=16)
    m.phase = StepKind.DECODE
    assert m.decide(EngineView(running=8, prefilling=0, waiting=5)).phase is StepKind.PREFILL
    m.observe(admitted=0, prefill_tokens=0, running_after=8)  # the engine had no blocks
    assert m.stats.kv_backoffs == 1
    # same running count: stay in decode, do not retry
    for _ in range(3):
        assert m.decide(EngineView(running=8, prefilling=0, waiting=5)).phase is StepKind.DECODE
    # one finished: try again
    assert m.decide(EngineView(running=7, prefilling=0, waiting=5)).phase is StepKind.PREFILL


def test_no_backoff_when_the_step_computed_prompt_chunks() -> None:
    m = machine(Mode.EB, k=2, n=16)
    m.decide(EngineView(running=3, prefilling=1, waiting=5))
    m.observe(admitted=0, prefill_tokens=64, running_after=3)
    assert m.stats.kv_backoffs == 0
    assert m.decide(EngineView(running=3, prefilling=1, waiting=5)).phase is StepKind.PREFILL


def test_backoff_released_when_nothing_runs() -> None:
    m = machine(Mode.EB, k=2, n=16)
    m.decide(EngineView(running=1, prefilling=0, waiting=5))
    m.observe(admitted=0, prefill_tokens=0, running_after=1)
    assert m.decide(EngineView(running=0, prefilling=0, waiting=5)).phase is StepKind.PREFILL


def test_mb_steps_never_back_off() -> None:
    m = machine(Mode.MB)
    m.decide(EngineView(running=8, prefilling=0, waiting=5))
    m.observe(admitted=0, prefill_tokens=0, running_after=8)
    assert m.stats.kv_backoffs == 0
    assert m.decide(EngineView(running=8, prefilling=0, waiting=5)).max_admit == 8


def test_predictive_head_fits_defers_prefill_while_decodes_run() -> None:
    m = machine(Mode.EB, k=2, n=16)
    m.phase = StepKind.DECODE
    full = EngineView(running=8, prefilling=0, waiting=5, head_fits=False)
    for _ in range(3):
        plan = m.decide(full)
        assert (plan.phase, plan.max_admit) == (StepKind.DECODE, 0)
    assert m.stats.kv_backoffs == 0  # nothing was attempted, nothing failed
    assert m.decide(EngineView(running=8, prefilling=0, waiting=5, head_fits=True)).phase is StepKind.PREFILL


def test_predictive_head_fits_ends_a_prefill_phase() -> None:
    m = machine(Mode.EB, k=2, n=16)
    m.decide(EngineView(running=4, prefilling=0, waiting=5))
    m.observe(2, 200, 6)
    plan = m.decide(EngineView(running=6, prefilling=0, waiting=3, head_fits=False))
    assert plan.phase is StepKind.DECODE


def test_head_fits_ignored_when_nothing_runs() -> None:
    # nothing will free blocks: the engine's own admission attempt decides
    m = machine(Mode.EB, k=2, n=16)
    plan = m.decide(EngineView(running=0, prefilling=0, waiting=5, head_fits=False))
    assert (plan.phase, plan.max_admit) == (StepKind.PREFILL, 5)


def test_engine_view_defaults_to_head_fits() -> None:
    assert EngineView(running=1, prefilling=0, waiting=1).head_fits is True


def test_a_bounded_prefill_phase_interleaves_decode_steps() -> None:
    """prefill_steps = 2: after two prefill steps in a row the running decoders get a token, then the phase goes on."""
    m = PhaseMachine(ThresholdUpdate(mode=Mode.EB, k=1, n=64, prefill_steps=2, prefill_tokens=512))
    long_prefill = EngineView(running=10, prefilling=1, waiting=0)  # one prompt chunked over many steps
    kinds = [m.decide(long_prefill) for _ in range(6)]
    assert [p.phase for p in kinds] == [StepKind.PREFILL, StepKind.PREFILL, StepKind.DECODE] * 2
    assert m.phase is StepKind.PREFILL and m.stats.prefill_phases == 1  # still one phase
    assert all(p.max_tokens == 512 for p in kinds if p.phase is StepKind.PREFILL)  # capped prefill steps
    assert all(p.max_tokens == 0 and p.decode and not p.prefill for p in kinds if p.phase is StepKind.DECODE)
    # nothing decoding: nothing to interleave
    alone = PhaseMachine(ThresholdUpdate(mode=Mode.EB, k=1, n=64, prefill_steps=1))
    only_prefill = EngineView(running=1, prefilling=1, waiting=0)
    assert [alone.decide(only_prefill).phase for _ in range(3)] == [StepKind.PREFILL] * 3


def test_unbounded_prefill_phases_by_default() -> None:
    m = PhaseMachine(ThresholdUpdate(mode=Mode.EB, k=1, n=64))
    view = EngineView(running=10, prefilling=1, waiting=0)
    assert {m.decide(view).phase for _ in range(8)} == {StepKind.PREFILL}
    assert m.decide(view).max_tokens == 0


def test_a_switch_to_mb_after_a_prefill_step_gives_the_decoders_their_token_first() -> None:
    """EB -> MB right after an exclusive prefill step: one decode-only step, then MB's mixed steps.

    A mixed step straight after the prefill step would hold the decoders' next token for both
    steps (in the simulator, H200: 0.39 s where EB's prefill bound kept every gap at 0.22 s).
    """
    m = PhaseMachine(ThresholdUpdate(mode=Mode.AUTO, k=2, n=64, active=Mode.EB, prefill_steps=1))
    busy = EngineView(running=20, prefilling=0, waiting=8)
    assert m.decide(busy).phase is StepKind.PREFILL
    m.apply(ThresholdUpdate(mode=Mode.AUTO, k=2, n=64, active=Mode.MB))
    first, then = m.decide(busy), m.decide(busy)
    assert (first.phase, first.prefill, first.max_admit) == (StepKind.DECODE, False, 0)
    assert (then.phase, then.max_admit) == (StepKind.MIXED, 44)
    # nothing decoding: nothing to hold back
    idle = PhaseMachine(ThresholdUpdate(mode=Mode.AUTO, k=2, n=64, active=Mode.EB))
    assert idle.decide(EngineView(running=0, prefilling=0, waiting=8)).phase is StepKind.PREFILL
    idle.apply(ThresholdUpdate(mode=Mode.AUTO, k=2, n=64, active=Mode.MB))
    assert idle.decide(EngineView(running=8, prefilling=8, waiting=0)).phase is StepKind.PREFILL
