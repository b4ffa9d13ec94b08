"""Validation of what replicas report, at the controller.

The controller trusts nothing a replica sends. A batch decoded from the wire
(:func:`ebplus.controller.messages.decode`) has the right *types*; an in-process
caller (the simulator, a test, a buggy replica) may hand over anything. Every
record passes :func:`check_completion`, :func:`check_step` or
:func:`check_running`, and :func:`clean_batch` checks the envelope: a bad record is
rejected with a reason the controller counts
(``ebplus_telemetry_rejected_total{reason=...}``) instead of raising.
"""

from __future__ import annotations

import math
import operator
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from ebplus.controller.messages import (
    WIRE_VERSION,
    CompletionRecord,
    EngineStats,
    FinishReason,
    RunningRequest,
    StepRecord,
    TelemetryBatch,
    WireError,
    decode,
)

# Lengths above this are treated as corrupt rather than as real requests.
MAX_TOKENS_PER_REQUEST = 10_000_000
# Steps slower than this are treated as corrupt (a stalled engine reports nothing).
MAX_STEP_SECONDS = 600.0
# A request's TTFT or stall above this (a day) is treated as corrupt.
MAX_LATENCY_SECONDS = 86_400.0
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
    "bad_batch",  # a batch, or a batch field, of the wrong shape
    "bad_version",  # a message of a wire version this controller does not speak
    "duplicate",  # a record the controller already has (a timed-out push delivered late)
)


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


def _ints(record: Any, names: Sequence[str], lo: int, hi: int) -> list[int] | str:
    out = []
    for name in names:
        v = check_int(getattr(record, name, None), lo, hi)
        if isinstance(v, str):
            return v
        out.append(v)
    return out


def check_completion(record: Any) -> CompletionRecord | str:
    """A validated :class:`CompletionRecord`, or the reason it was rejected."""
    if not isinstance(record, CompletionRecord):
        return "bad_type"
    try:
        finish = FinishReason(record.finish)
    except (ValueError, TypeError):
        return "bad_finish_reason"
    input_len = check_int(record.input_len, 1, MAX_TOKENS_PER_REQUEST)
    if isinstance(input_len, str):
        return input_len
    lo = 0 if finish in (FinishReason.ABORT, FinishReason.ERROR) else 1
    output_len = check_int(record.output_len, lo, MAX_TOKENS_PER_REQUEST)
    if isinstance(output_len, str):
        return output_len
    extra = _ints(record, ("max_tokens", "cached_tokens"), 0, MAX_TOKENS_PER_REQUEST)
    if isinstance(extra, str):
        return extra
    seq = check_int(record.seq, -1, MAX_COUNT)
    if isinstance(seq, str):
        return seq
    for value in (record.ttft_s, record.stall_s):
        checked = check_seconds(value, MAX_LATENCY_SECONDS)
        if isinstance(checked, str):
            return checked
    return record


def check_seconds(value: Any, limit: float) -> float | str:
    """A duration in [0, ``limit``] seconds, or the reason it is not one."""
    if value is None:
        return "missing_field"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "bad_type"
    if not math.isfinite(value):
        return "not_finite"
    if value < 0:
        return "negative"
    if value > limit:
        return "absurd_value"
    return float(value)


def check_step(record: Any) -> StepRecord | str:
    """A validated :class:`StepRecord`, or the reason it was rejected."""
    if not isinstance(record, StepRecord):
        return "bad_type"
    values = _ints(record, ("prefill_tokens", "decode_tokens", "running", "waiting"), 0, MAX_TOKENS_PER_REQUEST)
    if isinstance(values, str):
        return values
    if values[0] + values[1] == 0:
        return "empty_step"
    seconds = check_seconds(record.seconds, MAX_STEP_SECONDS)
    if isinstance(seconds, str):
        return seconds
    if seconds == 0:
        return "out_of_range"
    kv = check_int(record.kv_tokens, 0, MAX_KV_TOKENS)
    if isinstance(kv, str):
        return kv
    return record


def check_running(record: Any) -> RunningRequest | str:
    """A validated :class:`RunningRequest`, or the reason it was rejected."""
    if not isinstance(record, RunningRequest):
        return "bad_type"
    seq = check_int(record.seq, 0, MAX_COUNT)
    if isinstance(seq, str):
        return seq
    values = _ints(record, ("input_len", "age", "max_tokens", "cached_tokens"), 0, MAX_TOKENS_PER_REQUEST)
    if isinstance(values, str):
        return values
    if values[0] < 1:
        return "out_of_range"
    return record


@dataclass(frozen=True)
class CleanBatch:
    """The usable part of a batch: envelope fields checked; records still raw (see :func:`valid`)."""

    replica_id: str
    completions: Sequence[Any]
    steps: Sequence[Any]
    running: Sequence[Any] | None  # None: the replica reported nothing about running requests
    running_total: int
    applied_version: int | None
    dropped_completions: int
    dropped_steps: int
    stats: EngineStats | None
    completions_from: int | None  # None: not tracked
    steps_from: int | None
    request_rate: float = 1.0  # share of its requests the replica reports (replicas/sampling.py)
    step_rate: float = 1.0


def _count(value: object, rejected: Counter[str]) -> int:
    """A non-negative counter from a batch (0, and ``bad_batch`` counted, when it is not one)."""
    n = check_int(0 if value is None else value, 0, MAX_COUNT)
    if isinstance(n, str):
        rejected["bad_batch"] += 1
        return 0
    return n


def _records(value: object, rejected: Counter[str]) -> Sequence[Any]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        rejected["bad_batch"] += 1
        return ()
    return value


def clean_batch(batch: object, rejected: Counter[str]) -> CleanBatch | None:
    """Check a batch's envelope; ``None`` (and ``unknown_replica`` counted) if it names no replica.

    Fields of the wrong shape are counted as ``bad_batch`` and read as empty or
    zero; engine counters that are not finite non-negative counts as
    ``bad_engine_stats`` (and ignored). Nothing here raises.
    """
    rid = getattr(batch, "replica_id", None) if isinstance(batch, TelemetryBatch) else None
    if not isinstance(rid, str):
        rejected["unknown_replica"] += 1
        return None
    applied = check_int(batch.applied_version, 0, MAX_COUNT)
    stats = batch.stats
    if stats is not None and (not isinstance(stats, EngineStats) or stats.problem(MAX_COUNT) is not None):
        rejected["bad_engine_stats"] += 1
        stats = None
    running = None
    total = check_int(batch.running_total, 0, MAX_COUNT)
    if isinstance(total, int):
        running = _records(batch.running, rejected)
    elif batch.running_total != -1:
        rejected["bad_batch"] += 1
    cursors = [check_int(getattr(batch, name), 0, MAX_COUNT) for name in ("completions_from", "steps_from")]
    rates = [_share(getattr(batch, name), rejected) for name in ("request_rate", "step_rate")]
    return CleanBatch(
        replica_id=rid,
        completions=_records(batch.completions, rejected),
        steps=_records(batch.steps, rejected),
        running=running,
        running_total=total if isinstance(total, int) else 0,
        applied_version=applied if isinstance(applied, int) else None,
        dropped_completions=_count(batch.dropped_completions, rejected),
        dropped_steps=_count(batch.dropped_steps, rejected),
        stats=stats,
        completions_from=cursors[0] if isinstance(cursors[0], int) else None,
        steps_from=cursors[1] if isinstance(cursors[1], int) else None,
        request_rate=rates[0],
        step_rate=rates[1],
    )


#: The smallest share a replica may report: below it a batch's counts would be scaled up absurdly.
MIN_SHARE = 1e-3


def _share(value: object, rejected: Counter[str]) -> float:
    """A sampling share in ``[MIN_SHARE, 1]`` (1, and ``bad_batch`` counted, when it is not one)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not MIN_SHARE <= value <= 1:
        rejected["bad_batch"] += 1
        return 1.0
    return float(value)


def valid(records: Sequence[Any], check: Any, rejected: Counter[str]) -> list:
    """The records that pass ``check``; each rejected one counted by its reason.

    A batch whose records are all well-formed (every batch a healthy replica sends) is
    recognised column by column (:func:`all_valid`) instead of record by record: same
    answer, a fraction of the work. Anything else takes the per-record path, which names
    the reason of each rejection.
    """
    if all_valid(records, check):
        return records if isinstance(records, list) else list(records)
    out = []
    for raw in records:
        rec = check(raw)
        if isinstance(rec, str):
            rejected[rec] += 1
        else:
            out.append(rec)
    return out


# --------------------------------------------------------------------------- the whole-batch check

_INT = {int}


def _ints_in(column: tuple, lo: int, hi: int) -> bool:
    """Every value a plain ``int`` (not a bool, not a float) in ``[lo, hi]``."""
    return set(map(type, column)) == _INT and lo <= min(column) and max(column) <= hi


_NUMBER = {int, float}


def _seconds_in(column: tuple, limit: float) -> bool:
    """Every value a plain ``int`` or ``float`` (not a bool), finite, in ``[0, limit]`` (:func:`check_seconds`)."""
    return (
        set(map(type, column)) <= _NUMBER
        and all(map(math.isfinite, column))
        and min(column) >= 0
        and max(column) <= limit
    )


def _completions_ok(records: Sequence[Any]) -> bool:
    inp, out, fin, seq, cap, cached, ttft, stall = zip(*map(_COMPLETION_FIELDS, records), strict=True)
    return (
        set(map(type, fin)) == {FinishReason}
        and _ints_in(inp, 1, MAX_TOKENS_PER_REQUEST)
        and _ints_in(out, 1, MAX_TOKENS_PER_REQUEST)  # 0 is valid only for aborts: those take the long path
        and _ints_in(cap, 0, MAX_TOKENS_PER_REQUEST)
        and _ints_in(cached, 0, MAX_TOKENS_PER_REQUEST)
        and _ints_in(seq, -1, MAX_COUNT)
        and _seconds_in(ttft, MAX_LATENCY_SECONDS)
        and _seconds_in(stall, MAX_LATENCY_SECONDS)
    )


def _steps_ok(records: Sequence[Any]) -> bool:
    prefill, decode, running, waiting, seconds, kv = zip(*map(_STEP_FIELDS, records), strict=True)
    return (
        all(_ints_in(col, 0, MAX_TOKENS_PER_REQUEST) for col in (prefill, decode, running, waiting))
        and min(map(operator.add, prefill, decode)) > 0
        and set(map(type, seconds)) == {float}
        and all(map(math.isfinite, seconds))
        and min(seconds) > 0.0
        and max(seconds) <= MAX_STEP_SECONDS
        and _ints_in(kv, 0, MAX_KV_TOKENS)
    )


def _running_ok(records: Sequence[Any]) -> bool:
    seq, inp, age, cap, cached = zip(*map(_RUNNING_FIELDS, records), strict=True)
    return (
        _ints_in(seq, 0, MAX_COUNT)
        and _ints_in(inp, 1, MAX_TOKENS_PER_REQUEST)
        and all(_ints_in(col, 0, MAX_TOKENS_PER_REQUEST) for col in (age, cap, cached))
    )


_COMPLETION_FIELDS = operator.attrgetter(*CompletionRecord.__struct_fields__)
_STEP_FIELDS = operator.attrgetter(*StepRecord.__struct_fields__)
_RUNNING_FIELDS = operator.attrgetter(*RunningRequest.__struct_fields__)
_WHOLE_BATCH: dict[Callable[[Any], Any], tuple[type, Callable[[Sequence[Any]], bool]]] = {
    check_completion: (CompletionRecord, _completions_ok),
    check_step: (StepRecord, _steps_ok),
    check_running: (RunningRequest, _running_ok),
}


def all_valid(records: Sequence[Any], check: Callable[[Any], Any]) -> bool:
    """Whether every record passes ``check`` (one of the three checks above), decided per column.

    ``True`` only when it is certain: records of exactly the message type, fields of
    exactly the wire types, every value in range. A record that is merely unusual (an
    abort with no output, a float count, a finish reason given as a string) makes it
    ``False``, and :func:`valid` then checks record by record - the only path that can
    reject, so the two agree on what is accepted.
    """
    if not records:
        return True
    kind, columns_ok = _WHOLE_BATCH[check]
    return set(map(type, records)) == {kind} and columns_ok(records)


# --------------------------------------------------------------------------- from the wire


class _LooseBatch(msgspec.Struct, kw_only=True):
    """A :class:`TelemetryBatch` read leniently: records undecoded, scalars unchecked (see :func:`decode_batch`)."""

    wire: int = WIRE_VERSION
    replica_id: Any = None
    completions: list[msgspec.Raw] = []
    steps: list[msgspec.Raw] = []
    running: list[msgspec.Raw] = []
    running_total: Any = -1
    applied_version: Any = 0
    dropped_completions: Any = 0
    dropped_steps: Any = 0
    sent_at: Any = 0.0
    stats: msgspec.Raw | None = None
    completions_from: Any = -1
    steps_from: Any = -1
    request_rate: Any = 1.0
    step_rate: Any = 1.0


_LOOSE = msgspec.msgpack.Decoder(_LooseBatch)


def _reason(exc: msgspec.ValidationError) -> str:
    message = str(exc)
    if "Invalid enum value" in message:
        return "bad_finish_reason"
    if "missing required field" in message or "of at least length" in message:
        return "missing_field"
    return "bad_type"


def _decode_each(raws: list[msgspec.Raw], kind: type, rejected: Counter[str]) -> list:
    out = []
    for raw in raws:
        try:
            out.append(msgspec.msgpack.decode(raw, type=kind))
        except msgspec.ValidationError as exc:
            rejected[_reason(exc)] += 1
        except msgspec.DecodeError:
            rejected["bad_type"] += 1
    return out


def decode_batch(payload: bytes, rejected: Counter[str]) -> TelemetryBatch:
    """A batch from the wire, keeping every record that decodes.

    One strict decode is the fast path. If it fails because some records are
    malformed (a NaN where a count belongs, an unknown finish reason, a short
    record), the batch is read again leniently: each record on its own, the bad
    ones counted in ``rejected`` by reason, the good ones kept - one bad record
    must not cost a replica the rest of its batch.

    Raises:
        WireError: the envelope itself is unreadable, or of another version.
    """
    try:
        return decode(payload, TelemetryBatch)
    except WireError as exc:
        if exc.reason != "bad_batch":
            raise
    try:
        loose = _LOOSE.decode(payload)
    except (msgspec.DecodeError, ValueError) as exc:
        raise WireError("bad_batch", f"not a TelemetryBatch: {exc}") from None
    stats = None
    if loose.stats is not None:
        try:
            stats = msgspec.msgpack.decode(loose.stats, type=EngineStats)
        except (msgspec.ValidationError, msgspec.DecodeError):
            rejected["bad_engine_stats"] += 1
    return TelemetryBatch(
        replica_id=loose.replica_id,
        completions=_decode_each(loose.completions, CompletionRecord, rejected),
        steps=_decode_each(loose.steps, StepRecord, rejected),
        running=_decode_each(loose.running, RunningRequest, rejected),
        running_total=loose.running_total,
        applied_version=loose.applied_version,
        dropped_completions=loose.dropped_completions,
        dropped_steps=loose.dropped_steps,
        sent_at=loose.sent_at,
        stats=stats,
        completions_from=loose.completions_from,
        steps_from=loose.steps_from,
        request_rate=loose.request_rate,
        step_rate=loose.step_rate,
    )
