"""The scheduler's telemetry buffers and step timing (replicas.recorder), with a fake clock."""

from __future__ import annotations

import pytest
from ebplus.replicas.recorder import COUNTERS, TelemetryRecorder, step_kind


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def recorder(capacity: int = 100, warmup: int = 0) -> tuple[TelemetryRecorder, Clock]:
    clock = Clock()
    return TelemetryRecorder(capacity, warmup_steps=warmup, clock=clock), clock


@pytest.mark.parametrize(("p", "d", "kind"), [(5, 0, "prefill"), (0, 3, "decode"), (5, 3, "mixed"), (0, 0, "idle")])
def test_step_kind(p: int, d: int, kind: str) -> None:
    assert step_kind(p, d) == kind


def test_sync_steps_are_timed_from_schedule_exit_to_update() -> None:
    rec, clock = recorder()
    for i, (p, d) in enumerate([(64, 0), (0, 8), (10, 7)]):
        key = object()
        clock.t = 10.0 * i
        rec.scheduled(key, p, d, running=8, waiting=2, preempted=0, t_exit=clock.t + 0.001)
        clock.t += 0.5
        rec.updated(key)
    out = rec.drain()
    assert out["steps"] == [
        [64, 0, 8, 2, pytest.approx(0.499), "prefill", 0],
        [0, 8, 8, 2, pytest.approx(0.499), "decode", 0],
        [10, 7, 8, 2, pytest.approx(0.499), "mixed", 0],
    ]
    assert (out["stats"]["steps_prefill"], out["stats"]["steps_decode"], out["stats"]["steps_mixed"]) == (1, 1, 1)


def test_step_rows_carry_the_kv_the_decodes_read() -> None:
    rec, clock = recorder()
    key = object()
    rec.scheduled(key, 0, 4, running=4, waiting=0, preempted=0, t_exit=0.0, kv_tokens=4 * 700)
    clock.t = 0.02
    rec.updated(key)
    assert rec.drain()["steps"] == [[0, 4, 4, 0, pytest.approx(0.02), "decode", 2800]]


def test_batch_queue_overlap_starts_a_step_at_the_previous_update() -> None:
    # async scheduling: step 2 is scheduled (t=0.1) while step 1 runs until t=1.0
    rec, clock = recorder()
    a, b = object(), object()
    rec.scheduled(a, 0, 4, 4, 0, 0, t_exit=0.0)
    rec.scheduled(b, 0, 4, 4, 0, 0, t_exit=0.1)
    clock.t = 1.0
    rec.updated(a)
    clock.t = 1.8
    rec.updated(b)
    secs = [row[4] for row in rec.drain()["steps"]]
    assert secs == [pytest.approx(1.0), pytest.approx(0.8)]


def test_empty_steps_are_counted_not_recorded() -> None:
    rec, _ = recorder()
    idle, busy = object(), object()
    rec.scheduled(idle, 0, 0, running=0, waiting=0, preempted=0, t_exit=0.0)
    rec.updated(idle)
    rec.scheduled(busy, 0, 0, running=3, waiting=2, preempted=1, t_exit=0.0)
    rec.updated(busy)
    out = rec.drain()
    assert out["steps"] == []
    assert out["stats"]["steps_idle"] == 2
    assert out["stats"]["steps_empty_busy"] == 1
    assert out["stats"]["preemptions"] == 1


def test_warmup_steps_are_withheld_and_counted() -> None:
    rec, clock = recorder(warmup=2)
    for _ in range(5):
        key = object()
        rec.scheduled(key, 0, 0, 0, 0, 0, t_exit=clock.t)  # empty steps do not use up the warm-up
        rec.updated(key)
    for _ in range(3):
        key = object()
        rec.scheduled(key, 0, 2, 2, 0, 0, t_exit=clock.t)
        clock.t += 1.0
        rec.updated(key)
    out = rec.drain()
    assert len(out["steps"]) == 1
    assert out["stats"]["steps_warmup"] == 2
    assert out["stats"]["steps_decode"] == 3


def test_unknown_output_is_ignored() -> None:
    rec, _ = recorder()
    key = object()
    rec.scheduled(key, 0, 1, 1, 0, 0, t_exit=0.0)
    rec.updated(object())  # not scheduled through the recorder
    rec.updated(key)
    assert len(rec.drain()["steps"]) == 1


def test_bounded_buffers_drop_oldest_and_count() -> None:
    rec, _ = recorder(capacity=3)
    for i in range(5):
        rec.finished(10 + i, 5, "stop")
        key = object()
        rec.scheduled(key, i + 1, 0, 1, 0, 0, t_exit=0.0)
        rec.updated(key)
    out = rec.drain()
    assert [c[0] for c in out["completions"]] == [12, 13, 14]
    assert [s[0] for s in out["steps"]] == [3, 4, 5]
    assert (out["dropped_completions"], out["dropped_steps"]) == (2, 2)
    again = rec.drain()
    assert again["completions"] == again["steps"] == []
    assert again["dropped_completions"] == again["dropped_steps"] == 0
    assert again["stats"]["steps_prefill"] == 5  # counters are cumulative


def test_drain_contract() -> None:
    rec, _ = recorder()
    rec.finished(7, 3, "length")
    out = rec.drain()
    assert set(out) == {"completions", "steps", "dropped_completions", "dropped_steps", "stats"}
    assert out["completions"] == [[7, 3, "length"]]
    assert tuple(out["stats"]) == COUNTERS
    assert all(isinstance(v, int | float) and v >= 0 for v in out["stats"].values())


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity"):
        TelemetryRecorder(0)
