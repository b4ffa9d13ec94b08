"""The controller's one intake of telemetry: wire bytes in, a valid batch out, never an exception.

The controller trusts nothing a replica sends, and everything it hears is wire bytes
(the Ray replica and the plain-vLLM plugin push through
:class:`~ebplus.controller.client.ControllerClient`, the simulator and the tests
encode their batches too). The rules are the message types' own
(:mod:`ebplus.controller.messages`: field bounds that msgspec checks while decoding,
and a record's :meth:`problem` for what no single field can say).

:func:`intake` decodes a batch strictly first: a healthy replica's batch is valid as a
whole, and msgspec checks it in C. Only a batch that fails is read again by
:func:`decode_lenient`, field by field and record by record, so that a bad record costs
only itself: it is dropped and counted by reason
(``ebplus_telemetry_rejected_total{reason=...}``), and the rest of its batch is kept.
"""

from __future__ import annotations

import math
import typing
from collections import Counter
from functools import cache
from typing import Any, NamedTuple, TypeVar

import msgspec

from ebplus.controller.messages import TelemetryBatch, WireError, convert, decode

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
    "cursor_jump",  # records whose index skips past what the replica can have dropped (the cursor stays)
    "implausible",  # beyond what the request or its replica declared (max_tokens, max_model_len)
)

#: What an unusable envelope field is counted as (any other: ``bad_batch``).
_FIELD_REASONS = {"replica_id": "unknown_replica", "stats": "bad_engine_stats"}

E = TypeVar("E", bound=msgspec.Struct)


def intake(payload: bytes, rejected: Counter[str]) -> TelemetryBatch | None:
    """The valid part of a :class:`TelemetryBatch`, or ``None`` if it has none (counted in ``rejected``).

    Records that break a rule are left out and counted by reason; an envelope field
    that does is counted and read as its default. ``None``: not a batch, a batch of
    another wire version, or one that names no replica.
    """
    try:
        batch = decode_lenient(payload, TelemetryBatch, rejected)
    except WireError as exc:
        rejected[exc.reason] += 1
        return None
    kept = {}
    for name in _RULED_RECORDS:
        records = getattr(batch, name)
        good = [r for r in records if r.problem() is None]
        if len(good) != len(records):
            rejected.update(reason for r in records if (reason := r.problem()) is not None)
            kept[name] = good
    return msgspec.structs.replace(batch, **kept) if kept else batch


def decode_lenient(payload: bytes, kind: type[E], rejected: Counter[str]) -> E:
    """``payload`` as a ``kind`` (an envelope of :mod:`~ebplus.controller.messages`), keeping what is valid.

    Strict first (:func:`~ebplus.controller.messages.decode`). If that fails, each field
    is read on its own: a list of records keeps the records that decode, each one
    refused counted in ``rejected`` by why its type refused it; any other field that
    does not decode is counted (``bad_batch``, or its own reason) and left at its default.

    Raises:
        WireError: not an envelope at all, one of another wire version, or a required
            field unusable (``reason`` is what the caller counts it as).
    """
    try:
        return decode(payload, kind)
    except WireError as exc:
        if exc.reason != "bad_batch" or not isinstance(payload, bytes | bytearray | memoryview):
            raise
    try:
        fields = msgspec.msgpack.decode(payload)
    except (msgspec.DecodeError, ValueError, RecursionError) as exc:
        raise WireError("bad_batch", f"not a {kind.__name__}: {exc}") from None
    if not isinstance(fields, dict):
        raise WireError("bad_batch", f"not a {kind.__name__}: a {type(fields).__name__}")
    values = {}
    for field in _fields(kind):
        if field.key not in fields:
            if field.required:
                raise WireError(_FIELD_REASONS.get(field.name, "bad_batch"), f"{kind.__name__} without {field.name}")
            continue
        value = fields[field.key]
        if field.records is not None and isinstance(value, list):
            values[field.name] = [r for raw in value if (r := _record(raw, field.records, rejected)) is not None]
            continue
        try:
            values[field.name] = convert(value, field.hint)
        except msgspec.ValidationError as exc:
            reason = _FIELD_REASONS.get(field.name, "bad_batch")
            if field.required:
                raise WireError(reason, f"{kind.__name__}.{field.name}: {exc}") from None
            rejected[reason] += 1
    try:
        return kind(**values)
    except (TypeError, ValueError) as exc:  # a rule across fields (ThresholdUpdate's k <= n)
        raise WireError("bad_batch", f"not a {kind.__name__}: {exc}") from None


# --------------------------------------------------------------------------- one field, one record


class _Field(NamedTuple):
    name: str
    key: str  # its name on the wire
    hint: Any  # the annotated type, bounds included
    info: msgspec.inspect.Type  # the same, as msgspec describes it (its bounds, for the reason of a refusal)
    required: bool
    records: type | None  # for a list of records: the record type


@cache
def _fields(kind: type) -> tuple[_Field, ...]:
    hints = typing.get_type_hints(kind, include_extras=True)
    out = []
    for f in msgspec.inspect.type_info(kind).fields:  # type: ignore[attr-defined]
        item = f.type.item_type if isinstance(f.type, msgspec.inspect.ListType) else None
        records = item.cls if isinstance(item, msgspec.inspect.StructType) else None
        out.append(_Field(f.name, f.encode_name, hints[f.name], f.type, f.required, records))
    return tuple(out)


#: The batch's lists of records whose type has a rule across its fields (``problem``).
_RULED_RECORDS = tuple(f.name for f in _fields(TelemetryBatch) if hasattr(f.records, "problem"))


def _record(raw: Any, kind: type, rejected: Counter[str]) -> Any:
    """``raw`` (a record as builtins) as a ``kind``; ``None``, and the reason counted, if it is not one."""
    try:
        return convert(raw, kind)
    except msgspec.ValidationError:
        rejected[_refusal(raw, kind)] += 1
        return None


def _refusal(raw: Any, kind: type) -> str:
    """Why ``raw`` is not a ``kind`` (an ``array_like`` record): its first field that is not valid says."""
    if not isinstance(raw, list):
        return "bad_type"
    fields = _fields(kind)
    for field, value in zip(fields, raw, strict=False):
        try:
            convert(value, field.hint)
        except msgspec.ValidationError:
            return _reason(value, field.info)
    if len(raw) < sum(f.required for f in fields):
        return "missing_field"
    return "bad_type"


def _reason(value: Any, info: msgspec.inspect.Type) -> str:
    """The reason a value its field's type refused is counted as, from the value and the type's bounds."""
    if value is None:
        return "missing_field"
    if isinstance(info, msgspec.inspect.EnumType):
        return "bad_finish_reason"  # the one enum of a record
    numbers = (int, float) if isinstance(info, msgspec.inspect.FloatType) else (int,)
    if type(value) not in numbers or not isinstance(info, msgspec.inspect.IntType | msgspec.inspect.FloatType):
        return "bad_type"
    if not math.isfinite(value):
        return "not_finite"
    if (info.ge is not None and value < info.ge) or (info.gt is not None and value <= info.gt):
        return "negative" if value < 0 else "out_of_range"
    if (info.le is not None and value > info.le) or (info.lt is not None and value >= info.lt):
        return "absurd_value"
    return "bad_type"
