"""The messages of the control loop, and their one codec.

Three processes talk: the EB+ scheduler inside vLLM's engine core, the replica
that hosts the engine (a Ray Serve replica, or vLLM's own API server with the
plugin), and the controller. Every message is a :class:`msgspec.Struct` with
named fields in code and a compact msgpack form on the wire (records are
``array_like``, as vLLM's own engine-core IPC does), and every hop uses the one
codec below: :func:`encode` and :func:`decode`.

Versioning. Envelopes carry ``wire`` (:data:`WIRE_VERSION`). Additive changes
(a new *trailing* field with a default) keep the version: an older sender's
message decodes with the default, a newer sender's extra field is ignored by an
older receiver. Anything else bumps :data:`WIRE_VERSION`, and a receiver refuses
a version it does not speak with :class:`WireError` (``reason="bad_version"``).
Mixed versions meet during a rolling update, which is why the replica and the
controller exchange bytes rather than pickled Python objects.

Nothing here imports vLLM or Ray: the scheduler, the replica, the controller
and the simulator all speak these types.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Annotated, Any, TypeVar

import msgspec
from msgspec import Meta
from pydantic import BaseModel, ValidationError

from ebplus.controller.cost_model import CostModel

#: Version of the envelopes below (see the module docstring for what bumps it).
WIRE_VERSION = 1

# --------------------------------------------------------------------------- limits
# What the controller accepts from a replica. msgspec checks these bounds when it
# decodes (in C, on the controller's hot path); building a message in code does not, so
# a producer never fails on a value the controller would refuse: the controller counts it.

#: Lengths above this are treated as corrupt rather than as real requests.
MAX_TOKENS_PER_REQUEST = 10_000_000
#: Steps slower than this are treated as corrupt (a stalled engine reports nothing).
MAX_STEP_SECONDS = 600.0
#: A request's TTFT or stall above this (a day) is treated as corrupt.
MAX_LATENCY_SECONDS = 86_400.0
#: KV tokens read by one step above this are treated as corrupt.
MAX_KV_TOKENS = 10**11
#: Counters (drops, versions, record indices, engine stats) above this are treated as corrupt.
MAX_COUNT = 2**62
#: The smallest share of its telemetry a replica may report: below it a batch's counts would be scaled up absurdly.
MIN_SHARE = 1e-3

Tokens = Annotated[int, Meta(ge=0, le=MAX_TOKENS_PER_REQUEST)]
Prompt = Annotated[int, Meta(ge=1, le=MAX_TOKENS_PER_REQUEST)]  # a request has at least one prompt token
Count = Annotated[int, Meta(ge=0, le=MAX_COUNT)]
Index = Annotated[int, Meta(ge=-1, le=MAX_COUNT)]  # -1: unknown, not tracked, not reported
Latency = Annotated[float, Meta(ge=0.0, le=MAX_LATENCY_SECONDS)]
StepSeconds = Annotated[float, Meta(gt=0.0, le=MAX_STEP_SECONDS)]
KVTokens = Annotated[int, Meta(ge=0, le=MAX_KV_TOKENS)]
Total = Annotated[float, Meta(ge=0.0, le=MAX_COUNT)]  # a cumulative duration
Share = Annotated[float, Meta(ge=MIN_SHARE, le=1.0)]


class Mode(StrEnum):
    """How a replica batches.

    ``MB``: mixed batching, vLLM v1's default. ``EB``: exclusive batching with
    threshold ``k``. ``V0``: prefill-first, i.e. EB with ``k = 1``. ``AUTO``: EB+,
    EB or MB as chosen by the control plane (``ThresholdUpdate.active``).
    ``SHADOW``: the controller plans as for ``AUTO`` and publishes its choice, but
    the replica keeps running MB (an operator's preview before trusting it).
    """

    MB = "mb"
    EB = "eb"
    V0 = "v0"
    AUTO = "auto"
    SHADOW = "shadow"


class StepKind(StrEnum):
    """What an engine step contains; also the phase an EB engine is in."""

    PREFILL = "prefill"  # prompt tokens only
    DECODE = "decode"  # decode tokens only
    MIXED = "mixed"  # both (MB)
    IDLE = "idle"  # nothing scheduled

    @classmethod
    def of(cls, prefill_tokens: int, decode_tokens: int) -> StepKind:
        """The kind of a step from the tokens it scheduled."""
        if prefill_tokens and decode_tokens:
            return cls.MIXED
        if prefill_tokens:
            return cls.PREFILL
        return cls.DECODE if decode_tokens else cls.IDLE


class FinishReason(StrEnum):
    """Why a request left the engine (vLLM's finish reasons, plus aborted/failed)."""

    STOP = "stop"  # EOS or a stop string: a natural completion
    LENGTH = "length"  # max_tokens or the model's length limit: the request's known cap
    ABORT = "abort"  # client went away, or the request was cancelled: right-censored
    ERROR = "error"


class Message(msgspec.Struct):
    """Base of every message: a msgspec Struct that pydantic models can also hold (views, persisted state).

    Pydantic validates one from its wire form (or an instance) with ``msgspec.convert``
    and serialises it with ``msgspec.to_builtins`` - the same shape as on the wire.
    """

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        def validate(value: Any) -> Any:
            if isinstance(value, cls):
                return value
            try:
                return convert(value, cls)
            except msgspec.ValidationError as exc:
                raise ValueError(str(exc)) from None

        return core_schema.no_info_plain_validator_function(
            validate,
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda v: msgspec.to_builtins(v, enc_hook=_enc_hook)
            ),
            json_schema_input_schema=core_schema.any_schema(),
        )


# --------------------------------------------------------------------------- controller -> replica


class ThresholdUpdate(Message, frozen=True):
    """What the controller tells a replica, and what the replica reports as applied.

    ``mode`` is the configured mode; ``active`` the policy actually run (``MB`` or
    ``EB``): for ``AUTO`` the controller's current choice, for ``SHADOW`` always
    ``MB`` (the choice it would make is in the admin API), otherwise implied by
    ``mode``. ``n`` caps concurrently running requests; ``k`` is the EB threshold
    (prefill once ``k`` requests can be admitted). ``version`` increases with each
    controller decision so replicas can report which one they run. ``prefill_steps``
    and ``prefill_tokens`` cut an EB prefill phase so running requests do not stall past
    a latency target (see ``replicas/phases.py``).
    """

    mode: Mode
    k: int
    n: int
    version: int = 0
    active: Mode = Mode.MB
    prefill_steps: int = 0  # EB: decode steps are interleaved after this many prefill steps in a row (0: never)
    prefill_tokens: int = 0  # EB: prompt tokens a prefill step may carry (0: the engine's budget)
    stagger_period_s: float = 0.0  # EB: seconds between this replica's timed windows (0: no stagger)
    stagger_phase: float = 0.0  # EB: where in that period its windows fall, in [0, 1)

    def __post_init__(self) -> None:
        # NOTE: msgspec turns a ValueError here into a ValidationError when decoding.
        if not isinstance(self.mode, Mode):
            msgspec.structs.force_setattr(self, "mode", Mode(self.mode))
        if not isinstance(self.active, Mode):
            msgspec.structs.force_setattr(self, "active", Mode(self.active))
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1, got {self.n!r}")
        if isinstance(self.k, bool) or not isinstance(self.k, int) or not 1 <= self.k <= self.n:
            raise ValueError(f"k must be an integer in [1, n={self.n}], got {self.k!r}")
        if isinstance(self.version, bool) or not isinstance(self.version, int) or self.version < 0:
            raise ValueError(f"version must be an integer >= 0, got {self.version!r}")
        for name in ("prefill_steps", "prefill_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
        if not (isinstance(self.stagger_period_s, (int, float)) and math.isfinite(self.stagger_period_s)
                and self.stagger_period_s >= 0):  # fmt: skip
            raise ValueError(f"stagger_period_s must be a finite number >= 0, got {self.stagger_period_s!r}")
        if not (isinstance(self.stagger_phase, (int, float)) and 0 <= self.stagger_phase < 1):
            raise ValueError(f"stagger_phase must be in [0, 1), got {self.stagger_phase!r}")
        if self.active not in (Mode.MB, Mode.EB):
            raise ValueError(f"active must be 'mb' or 'eb', got {self.active.value!r}")
        implied = {Mode.MB: Mode.MB, Mode.EB: Mode.EB, Mode.V0: Mode.EB, Mode.SHADOW: Mode.MB}.get(self.mode)
        if implied is not None and self.active is not implied:
            msgspec.structs.force_setattr(self, "active", implied)

    @property
    def effective_k(self) -> int:
        """The threshold the phase machine uses: 1 in ``V0`` mode."""
        return 1 if self.mode is Mode.V0 else self.k

    def replace(self, **changes: Any) -> ThresholdUpdate:
        """A copy with ``changes`` applied (and validated again)."""
        return msgspec.structs.replace(self, **changes)


# --------------------------------------------------------------------------- scheduler -> replica -> controller


class CompletionRecord(Message, frozen=True, array_like=True, gc=False):
    """One request that left the engine.

    ``seq`` is the request's admission order on its replica (-1: unknown), so the
    controller can tell an early cohort's first finishers from the workload.
    ``max_tokens`` is the most output tokens the request could produce (its
    ``max_tokens``, or what the model length leaves after the prompt; 0: unknown):
    a request that reaches it leaves at a time known when it was admitted.
    ``cached_tokens`` of the prompt were served from the prefix cache (not computed).
    ``ttft_s`` (arrival to first token) and ``stall_s`` (its longest wait between two
    output tokens) are what the request saw, as the engine measured it (0: not measured):
    the controller checks each mode's latency targets against them.
    """

    input_len: Prompt
    output_len: Tokens
    finish: FinishReason
    seq: Index = -1
    max_tokens: Tokens = 0
    cached_tokens: Tokens = 0
    ttft_s: Latency = 0.0
    stall_s: Latency = 0.0

    def problem(self) -> str | None:
        """The rule its fields' bounds cannot state alone (the reason it is refused), or ``None``:
        only an abort or an error leaves with no output token, and no request produces more than
        its ``max_tokens`` or finds more of its prompt cached than it has."""
        if self.max_tokens and self.output_len > self.max_tokens:
            return "implausible"  # more output than the request could produce
        if self.cached_tokens > self.input_len:
            return "implausible"
        if self.output_len or self.finish in _NO_OUTPUT:
            return None
        return "out_of_range"


_NO_OUTPUT = (FinishReason.ABORT, FinishReason.ERROR)


class StepRecord(Message, frozen=True, array_like=True, gc=False):
    """One engine step: what it computed, how long it took, the queue around it.

    ``running``/``waiting`` are right after the step was scheduled. ``kv_tokens``
    is the KV the step's decodes read (their summed context; 0 when the engine does
    not report it): decode cost grows with context, and a fit on the number of
    sequences alone confounds the two (see ``CostModelFitter``).
    """

    prefill_tokens: Tokens
    decode_tokens: Tokens
    running: Tokens
    waiting: Tokens
    seconds: StepSeconds
    kv_tokens: KVTokens = 0

    @property
    def kind(self) -> StepKind:
        return StepKind.of(self.prefill_tokens, self.decode_tokens)

    def problem(self) -> str | None:
        """The rule its fields' bounds cannot state alone (the reason it is refused), or ``None``:
        a step computed something (an idle step says nothing of the cost model)."""
        return None if self.prefill_tokens or self.decode_tokens else "empty_step"


#: Running requests a drain reports at most, evenly spaced over the running list beyond it
#: (the vLLM scheduler and the simulator both sample this way).
RUNNING_SAMPLE = 512


class RunningRequest(Message, frozen=True, array_like=True, gc=False):
    """A request still decoding when telemetry was sent: what the departure model needs of it.

    ``age`` is the output tokens it has produced so far: its natural length is
    longer than that (right-censored at ``age``), unless ``age`` has reached
    ``max_tokens``, where it leaves for certain.
    """

    seq: Count
    input_len: Prompt
    age: Tokens
    max_tokens: Tokens = 0
    cached_tokens: Tokens = 0


class EngineFacts(Message, frozen=True):
    """What an engine is: fixed at start-up."""

    kv_capacity_tokens: int
    max_num_seqs: int
    device: str = ""
    block_size: int = 16
    max_num_batched_tokens: int = 0  # the token budget per step (0: not reported)
    max_model_len: int = 0  # the longest prompt + output a request may have (0: not reported)


class EngineStats(Message, frozen=True, omit_defaults=True):
    """Cumulative engine counters (never reset: exporters take deltas)."""

    steps_prefill: Count = 0
    steps_decode: Count = 0
    steps_mixed: Count = 0
    steps_idle: Count = 0
    steps_empty_busy: Count = 0  # idle steps while requests were running or waiting
    steps_warmup: Count = 0  # timed steps withheld from the telemetry at start
    preemptions: Count = 0
    phase_switches: Count = 0
    kv_backoffs: Count = 0
    stagger_windows: Count = 0  # EB windows the stagger's timer opened
    schedule_seconds: Total = 0.0  # inside schedule(), vLLM's code included
    overhead_seconds: Total = 0.0  # EB+'s own code in the scheduler

    def steps(self, kind: StepKind) -> int:
        return int(getattr(self, f"steps_{kind.value}"))


class DrainReport(Message, frozen=True, kw_only=True):
    """What the scheduler hands its replica at each drain (``ebplus_drain``).

    ``running`` is a bounded sample of the running requests (``running_total`` in
    all), taken at the drain; records are everything since the previous drain.
    """

    wire: int = WIRE_VERSION
    completions: list[CompletionRecord] = []
    steps: list[StepRecord] = []
    running: list[RunningRequest] = []
    running_total: int = 0
    waiting_total: int = 0
    dropped_completions: int = 0
    dropped_steps: int = 0
    stats: EngineStats = EngineStats()
    facts: EngineFacts
    applied: ThresholdUpdate


class Registration(Message, frozen=True, kw_only=True):
    """A replica introducing itself to the controller (first push, or after a controller restart)."""

    wire: int = WIRE_VERSION
    replica_id: str
    mode: Mode
    facts: EngineFacts
    prior: CostModel
    #: the model it serves (vLLM's served model name; "" from a replica of an earlier release): the
    #: ``model_name`` label of its metrics, and whose plan a new replica starts from
    model: str = ""
    #: the index its next batch's first completion and step will carry (``TelemetryBatch.*_from``): a
    #: replica process that restarted under the same id counts from 0 again, and the controller's
    #: cursors follow it down instead of taking its records for duplicates (-1: an earlier release)
    completions_from: Index = -1
    steps_from: Index = -1


class TelemetryBatch(Message, frozen=True, kw_only=True):
    """What a replica pushes to the controller, periodically.

    ``applied_version`` is the threshold version the replica's scheduler runs, so
    the controller (and the admin API) can show whether a decision has landed.
    ``dropped_*`` count records lost to full buffers since the last batch.
    ``running`` replaces what the previous batch said of the running requests.

    ``completions_from`` / ``steps_from`` are the replica's running index of the
    batch's first record of each kind (-1: not tracked). A push that timed out may
    still be delivered after the replica re-sent its records in a later batch (a
    hung controller works off its queue when it resumes); the indices let the
    controller skip what it already has instead of counting it twice.

    ``request_rate`` / ``step_rate`` are the shares of its requests and engine cycles
    the replica reports (1: all; see ``ebplus.replicas.sampling``).

    The controller reads one with :func:`ebplus.controller.telemetry.intake`, which keeps
    the valid part of a batch that is not valid as a whole.
    """

    wire: int = WIRE_VERSION
    replica_id: str
    completions: list[CompletionRecord] = []
    steps: list[StepRecord] = []
    running: list[RunningRequest] = []
    running_total: Index = -1  # -1: the replica does not report running requests
    applied_version: Count = 0
    dropped_completions: Count = 0
    dropped_steps: Count = 0
    sent_at: float = 0.0
    stats: EngineStats | None = None
    completions_from: Index = -1
    steps_from: Index = -1
    request_rate: Share = 1.0
    step_rate: Share = 1.0


# --------------------------------------------------------------------------- replica -> routers

class PhaseReport(Message, frozen=True, kw_only=True):
    """An engine's batching as its scheduler sees it between two steps: the engine's half of a router's
    :class:`~ebplus.deploy.routing.PhaseBoard` (the scheduler's ``ebplus_board``, published by its replica many
    times a second; :mod:`ebplus.replicas.board`).

    ``mode`` is the policy it runs (``EB`` or ``MB``), ``prefilling`` whether an EB prefill window is open,
    ``freed`` the slots freed since its last window closed, ``prefill_tokens`` the prompt tokens it has yet to
    compute (queued and partly prefilled requests), ``kv_tokens`` what its running requests hold,
    ``decode_step_s`` its last decode-only step's seconds (0: none yet), ``mean_output`` and ``mean_prompt`` the
    mean output and prompt tokens of the requests it finished (0: none yet; what a router assumes of a request
    until the controller has an estimate), ``read_at`` when it was read (wall-clock seconds), ``slot_at`` when
    the controller's stagger next opens a window for a waiting request (wall-clock seconds, like the stagger's
    slots; ``None``: not staggered, or a replica that predates the field).
    """

    wire: int = WIRE_VERSION
    mode: Mode
    prefilling: bool
    running: Count
    waiting: Count
    n: Annotated[int, Meta(ge=1, le=MAX_COUNT)]
    k: Annotated[int, Meta(ge=1, le=MAX_COUNT)]
    freed: Count
    prefill_tokens: KVTokens
    kv_tokens: KVTokens
    decode_step_s: Annotated[float, Meta(ge=0.0, le=MAX_STEP_SECONDS)]
    mean_output: Annotated[float, Meta(ge=0.0, le=MAX_TOKENS_PER_REQUEST)]
    mean_prompt: Annotated[float, Meta(ge=0.0, le=MAX_TOKENS_PER_REQUEST)]
    read_at: float
    slot_at: float | None = None

    def __post_init__(self) -> None:
        if self.slot_at is not None and not math.isfinite(self.slot_at):
            raise ValueError(f"slot_at must be finite or null, got {self.slot_at!r}")
        if self.mode not in (Mode.MB, Mode.EB):
            raise ValueError(f"mode must be the policy run, 'mb' or 'eb', got {self.mode.value!r}")


class RoutingHints(Message, frozen=True, kw_only=True):
    """The controller's half of the routers' boards: what moves only when it re-estimates.

    ``p0``: the chance a running request finishes in one decode step (the workload estimate's hazard at
    age 0; ``None`` before the first estimate). ``mu_l``: the mean prompt tokens a request has to prefill
    (``None`` before the first estimate). ``beta_p``: per replica id, the seconds one prompt token costs in a
    prefill step (its cost model). ``cost``: per replica id, its whole cost model, which prices the delay a
    prompt adds to the others on that replica (``PhaseBoard.join_delay_s``; absent from an earlier
    controller's hints: routers then break ties by load alone).
    """

    wire: int = WIRE_VERSION
    p0: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    mu_l: Annotated[float, Meta(ge=0.0, le=MAX_TOKENS_PER_REQUEST)] | None = None
    beta_p: dict[str, Annotated[float, Meta(ge=0.0, le=MAX_STEP_SECONDS)]] = {}
    cost: dict[str, CostModel] = {}


# --------------------------------------------------------------------------- the codec


class WireError(ValueError):
    """A message that cannot be decoded; ``reason`` is what the controller counts it as."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def _dec_hook(typ: type, obj: Any) -> Any:
    if isinstance(typ, type) and issubclass(typ, BaseModel):
        try:
            return typ.model_validate(obj)
        except ValidationError as exc:
            raise ValueError(str(exc).splitlines()[0]) from None
    raise NotImplementedError(f"cannot decode {typ!r}")


_ENCODER = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
_DECODERS: dict[type, msgspec.msgpack.Decoder] = {}
T = TypeVar("T")


def encode(message: msgspec.Struct) -> bytes:
    """The wire form of any message of this module."""
    return _ENCODER.encode(message)


def convert(value: Any, kind: Any) -> Any:
    """``value``, as a generic msgpack decode gives it (builtins), as ``kind`` (any type a message field has),
    checked as :func:`decode` checks it.

    Raises:
        msgspec.ValidationError: ``value`` is not a ``kind``.
    """
    return msgspec.convert(value, kind, dec_hook=_dec_hook)


def decode(data: bytes, kind: type[T]) -> T:
    """Decode and type-check ``data`` as ``kind``.

    Raises:
        WireError: not msgpack, not a ``kind`` (``bad_batch``), or an envelope of
            another :data:`WIRE_VERSION` (``bad_version``).
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WireError("bad_batch", f"expected bytes, got {type(data).__name__}")
    if "wire" in getattr(kind, "__struct_fields__", ()):
        # the version first: a message of another version may not even have this shape
        try:
            version = _VERSION_DECODER.decode(data).wire
        except (msgspec.DecodeError, ValueError) as exc:
            raise WireError("bad_batch", f"not a {kind.__name__}: {exc}") from None
        if version != WIRE_VERSION:
            raise WireError("bad_version", f"{kind.__name__} version {version}, this side speaks {WIRE_VERSION}")
    decoder = _DECODERS.get(kind)
    if decoder is None:
        decoder = _DECODERS[kind] = msgspec.msgpack.Decoder(kind, dec_hook=_dec_hook)
    try:
        return decoder.decode(data)
    except (msgspec.DecodeError, ValueError) as exc:
        raise WireError("bad_batch", f"not a {kind.__name__}: {exc}") from None


class _Versioned(msgspec.Struct):
    """Any envelope, read for its wire version only (other fields are ignored)."""

    wire: int = WIRE_VERSION


_VERSION_DECODER = msgspec.msgpack.Decoder(_Versioned)
