"""Replica-side plumbing that needs no engine: the telemetry outbox and the prior profile choice."""

from __future__ import annotations

import pytest

from controller.telemetry import CompletionRecord, FinishReason, StepRecord
from replicas.profiles import profile_for_device
from replicas.server import TelemetryOutbox, to_completion, to_step


def test_outbox_is_bounded_and_counts_drops() -> None:
    box = TelemetryOutbox(capacity=3)
    box.add([CompletionRecord(1, i + 1, FinishReason.STOP) for i in range(5)], [], dropped_completions=2)
    assert [c.output_len for c in box.completions] == [3, 4, 5]
    assert box.dropped_completions == 2 + 2
    batch = box.batch("r", applied_version=7, engine_stats={"steps_decode": 1})
    assert batch.dropped_completions == 4 and batch.applied_version == 7 and len(batch.completions) == 3
    box.clear()
    assert not box.completions and box.dropped_completions == 0


def test_failed_push_keeps_records_for_the_next_try() -> None:
    box = TelemetryOutbox(capacity=10)
    box.add([], [StepRecord(1, 0, 1, 0, 0.1, "prefill")])
    box.batch("r", 0, {})  # push failed: nothing cleared
    box.add([], [StepRecord(0, 1, 1, 0, 0.1, "decode")])
    assert len(box.batch("r", 0, {}).steps) == 2


def test_rows_from_the_scheduler() -> None:
    assert to_completion([12, 5, "length"]) == CompletionRecord(12, 5, FinishReason.LENGTH)
    assert to_step([8, 0, 1, 3, 0.25, "prefill"]) == StepRecord(8, 0, 1, 3, 0.25, "prefill")
    with pytest.raises(ValueError):
        to_completion([1, 1, "exploded"])


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA RTX PRO 6000 Blackwell", "rtx-pro-6000"),
        ("NVIDIA H200 NVL", "h200-nvl"),
        ("cpu", "default"),
    ],
)
def test_profile_for_device(device: str, expected: str) -> None:
    settings = {
        "profile": "default",
        "profiles": {"H200": "h200", "H200 NVL": "h200-nvl", "L40S": "l40s", "RTX PRO 6000": "rtx-pro-6000"},
    }
    assert profile_for_device(settings, device) == expected
