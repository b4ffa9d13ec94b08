"""Telemetry records sent by replicas, and their validation at the controller.

Replicas send plain frozen dataclasses (cheap to build in the scheduler loop and
to pickle across Ray). The controller trusts nothing: every record passes
:func:`check_completion` / :func:`check_step`, and a bad one is rejected with a
reason the controller counts (``ebplus_telemetry_rejected_total{reason=...}``)
instead of raising.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

# Lengths above this are treated as corrupt rather than as real requests.
MAX_TOKENS_PER_REQUEST = 10_000_000
# Steps slower than this are treated as corrupt (a stalled engine reports nothing).
MAX_STEP_SECONDS = 600.0
# KV tokens read by one step above this are treated as corrupt.
MAX_KV_TOKENS = 10**11
# Counters (drops, versions, record indices, engine stats) above this are treated as corrupt.
MAX_COUNT = 2**62

# Every reason a record can be rejected for (exported as zero until seen).
REJECT_REASONS = (
    "missing_field",
    "bad_type",
    "not_finite",
    "negative",
    "out_of_range",
    "absurd_value",
    "bad_finish_reason",
    "empty_step",
    "unknown_replica",
    "bad_engine_stats",
    "bad_batch",  # a batch field of the wrong shape (records not a list, a counter not a count)
    "duplicate",  # a record the controller already has (a timed-out push delivered late)
)


class FinishReason(StrEnum):
    """Why a request left the engine (vLLM's finish reasons, plus aborted/failed)."""

    STOP = "stop"  # EOS or a stop string: a natural completion
    LENGTH = "length"  # max_tokens or the model's length limit: right-censored
    ABORT = "abort"  # client went away, or the request was cancelled
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class CompletionRecord:
    """One request that left the engine."""

    input_len: int
    output_len: int
    finish: FinishReason


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One engine step: what it computed, how long it took, the queue around it."""

    prefill_tokens: int
    decode_tokens: int
    running: int
    waiting: int
    seconds: float
    phase: str = ""
    # KV tokens the step's decodes read (the summed context of the decoding requests);
    # 0 when the engine does not report it. Decode cost grows with context, and a
    # fit in the number of sequences alone confounds the two (see CostModelFitter).
    kv_tokens: int = 0


@dataclass(frozen=True)
class TelemetryBatch:
    """What a replica pushes to the controller, periodically.

    ``applied_version`` is the threshold version the replica's scheduler runs, so
    the controller (and the admin API) can show whether a decision has landed.
    ``dropped_*`` count records lost to full buffers since the last batch.

    ``completions_from`` / ``steps_from`` are the replica's running index of the
    batch's first record of each kind (-1: not tracked). A push that timed out may
    still be delivered after the replica re-sent its records in a later batch (a
    hung controller works off its queue when it resumes); the indices let the
    controller skip what it already has instead of counting it twice.
    """

    replica_id: str
    completions: tuple[Any, ...] = ()
    steps: tuple[Any, ...] = ()
    applied_version: int = 0
    dropped_completions: int = 0
    dropped_steps: int = 0
    sent_at: float = 0.0
    extra: dict = field(default_factory=dict)
    completions_from: int = -1
    steps_from: int = -1


def check_int(value: Any, lo: int, hi: int) -> int | str:
    """``value`` as an int in ``[lo, hi]``, or the reason it is not one."""
    if value is None:
        return "missing_field"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "bad_type"
    if isinstance(value, float) and not math.isfinite(value):
        return "not_finite"
    if value != int(value):
        return "bad_type"
    if value < lo:
        return "negative" if value < 0 else "out_of_range"
    if value > hi:
        return "absurd_value"
    return int(value)


def _int_field(record: Any, name: str, lo: int, hi: int) -> int | str:
    value = getattr(record, name, None) if not isinstance(record, dict) else record.get(name)
    return check_int(value, lo, hi)


def check_completion(record: Any) -> CompletionRecord | str:
    """A validated :class:`CompletionRecord`, or the reason it was rejected."""
    finish_raw = record.get("finish") if isinstance(record, dict) else getattr(record, "finish", None)
    if finish_raw is None:
        return "missing_field"
    try:
        finish = FinishReason(finish_raw)
    except ValueError:
        return "bad_finish_reason"
    input_len = _int_field(record, "input_len", 1, MAX_TOKENS_PER_REQUEST)
    if isinstance(input_len, str):
        return input_len
    lo = 0 if finish in (FinishReason.ABORT, FinishReason.ERROR) else 1
    output_len = _int_field(record, "output_len", lo, MAX_TOKENS_PER_REQUEST)
    if isinstance(output_len, str):
        return output_len
    if isinstance(record, CompletionRecord):
        return record
    return CompletionRecord(input_len=input_len, output_len=output_len, finish=finish)


def check_step(record: Any) -> StepRecord | str:
    """A validated :class:`StepRecord`, or the reason it was rejected."""
    values: dict[str, int] = {}
    for name in ("prefill_tokens", "decode_tokens", "running", "waiting"):
        v = _int_field(record, name, 0, MAX_TOKENS_PER_REQUEST)
        if isinstance(v, str):
            return v
        values[name] = v
    if values["prefill_tokens"] + values["decode_tokens"] == 0:
        return "empty_step"
    seconds = record.get("seconds") if isinstance(record, dict) else getattr(record, "seconds", None)
    if seconds is None:
        return "missing_field"
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        return "bad_type"
    if not math.isfinite(seconds):
        return "not_finite"
    if seconds <= 0:
        return "negative" if seconds < 0 else "out_of_range"
    if seconds > MAX_STEP_SECONDS:
        return "absurd_value"
    kv_raw = record.get("kv_tokens", 0) if isinstance(record, dict) else getattr(record, "kv_tokens", 0)
    kv = _int_field({"kv_tokens": 0 if kv_raw is None else kv_raw}, "kv_tokens", 0, MAX_KV_TOKENS)
    if isinstance(kv, str):
        return kv
    if isinstance(record, StepRecord):
        return record
    phase = record.get("phase", "") if isinstance(record, dict) else getattr(record, "phase", "")
    return StepRecord(seconds=float(seconds), phase=str(phase), kv_tokens=kv, **values)
