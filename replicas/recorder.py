"""The scheduler's telemetry: bounded buffers of step and completion records, and counters.

Pure Python (no vLLM import) so it is unit-tested without an engine. The
scheduler subclass calls :meth:`TelemetryRecorder.scheduled` right after each
``schedule()``, :meth:`~TelemetryRecorder.updated` at the start of each
``update_from_output()`` and :meth:`~TelemetryRecorder.finished` for every
request that leaves the engine; the replica takes everything since the last
call as one :class:`~ebplus.controller.messages.DrainReport` (an engine-core
utility call, :mod:`ebplus.replicas.control`).

Records are the wire types of :mod:`ebplus.controller.messages`: a
:class:`StepRecord` per step that scheduled something (``running``/``waiting``
right after the step was scheduled: requests holding a slot during the step,
and the queue left behind; ``kv_tokens`` the KV the step's decodes read), a
:class:`CompletionRecord` per request that left. Steps that schedule nothing
produce no record (they are counted as ``steps_idle``, and as
``steps_empty_busy`` when requests were running or waiting).

Step timing. A step's seconds are measured from the end of ``schedule()`` to
the start of ``update_from_output()`` for the same output, i.e. the model
forward and sampling, without the scheduler's own time. Under async scheduling
vLLM schedules step n+1 while step n runs, so a step's execution is taken to
start at ``max(its schedule exit, the previous update)``; ``update_from_output``
is called once per ``schedule()`` in FIFO order on both paths. The first
``warmup_steps`` timed steps of a fresh engine are not reported: their forwards
pay lazy initialisation (seconds on a CPU) and would only be outliers for the
controller's fit; they are counted as ``steps_warmup``.

Buffers are bounded deques: when full, the oldest record is dropped and counted
(``dropped_steps``/``dropped_completions`` in the next drain).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ebplus.controller.messages import (
    CompletionRecord,
    DrainReport,
    EngineFacts,
    EngineStats,
    FinishReason,
    RunningRequest,
    StepKind,
    StepRecord,
    ThresholdUpdate,
)


@dataclass(slots=True)
class _Pending:
    key: object
    t_exit: float
    step: tuple[int, int, int, int, int] | None  # (prefill, decode, running, waiting, kv); None: empty step


class TelemetryRecorder:
    """Bounded telemetry buffers plus cumulative counters.

    Args:
        capacity: records kept per kind between drains.
        warmup_steps: timed (non-empty) steps at the start whose records are withheld.
        clock: monotonic seconds; injected in tests.
    """

    def __init__(self, capacity: int, warmup_steps: int = 2, clock: Callable[[], float] = time.perf_counter) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.clock = clock
        self.steps: deque[StepRecord] = deque(maxlen=capacity)
        self.completions: deque[CompletionRecord] = deque(maxlen=capacity)
        self.dropped_steps = 0
        self.dropped_completions = 0
        #: cumulative counters, by :class:`EngineStats` field name
        self.counters: Counter[str] = Counter()
        self._warmup_left = warmup_steps
        self._pending: deque[_Pending] = deque()
        self._last_update = float("-inf")
        #: seconds of the last decode-only step, and the output and prompt tokens and count of the requests that
        #: finished: what the engine's phase board reports of its pace (:class:`~ebplus.controller.messages.PhaseReport`)
        self.last_decode_s = 0.0
        self.output_tokens = 0
        self.prompt_tokens = 0
        self.finished_requests = 0

    # -- taps -------------------------------------------------------------

    def scheduled(
        self,
        key: object,
        prefill_tokens: int,
        decode_tokens: int,
        running: int,
        waiting: int,
        preempted: int,
        t_exit: float,
        kv_tokens: int = 0,
    ) -> StepKind:
        """One ``schedule()`` returned (``key`` identifies its output); returns the step kind.

        ``kv_tokens``: the KV tokens the step's decodes read (their summed context).
        """
        kind = StepKind.of(prefill_tokens, decode_tokens)
        c = self.counters
        c[f"steps_{kind.value}"] += 1
        c["preemptions"] += preempted
        if kind is StepKind.IDLE and running + waiting > 0:
            c["steps_empty_busy"] += 1
        step = None if kind is StepKind.IDLE else (prefill_tokens, decode_tokens, running, waiting, kv_tokens)
        self._pending.append(_Pending(key, t_exit, step))
        return kind

    def updated(self, key: object) -> None:
        """``update_from_output()`` started for the output ``key``: close its step's timing."""
        now = self.clock()
        index = next((i for i, p in enumerate(self._pending) if p.key is key), None)
        if index is None:
            return  # not scheduled through us: nothing to time
        for _ in range(index):  # outputs vLLM never processed (cannot happen in 0.29; be safe)
            self._pending.popleft()
        pending = self._pending.popleft()
        start = max(pending.t_exit, self._last_update)
        self._last_update = now
        if pending.step is None:
            return
        if pending.step[0] == 0:  # no prompt tokens: a decode-only step
            self.last_decode_s = now - start
        if self._warmup_left > 0:
            self._warmup_left -= 1
            self.counters["steps_warmup"] += 1
            return
        prefill, decode, running, waiting, kv = pending.step
        record = StepRecord(prefill, decode, running, waiting, max(now - start, 1e-9), kv)
        self.dropped_steps += self._append(self.steps, record)

    def finished(self, record: CompletionRecord) -> None:
        """A request left the engine (natural stop, length cap, abort or error)."""
        self.dropped_completions += self._append(self.completions, record)
        if record.finish in (FinishReason.STOP, FinishReason.LENGTH):
            self.output_tokens += record.output_len
            self.prompt_tokens += record.input_len - record.cached_tokens
            self.finished_requests += 1

    @property
    def mean_output(self) -> float:
        """Mean output tokens of the requests that finished (not aborted) so far; 0 before the first."""
        return self.output_tokens / self.finished_requests if self.finished_requests else 0.0

    @property
    def mean_prompt(self) -> float:
        """Mean prompt tokens the requests that finished (not aborted) had to compute (prefix-cache hits aside)."""
        return self.prompt_tokens / self.finished_requests if self.finished_requests else 0.0

    @staticmethod
    def _append(buf: deque, record: object) -> int:
        full = len(buf) == buf.maxlen
        buf.append(record)
        return int(full)

    # -- read out ---------------------------------------------------------

    def drain(
        self,
        facts: EngineFacts,
        applied: ThresholdUpdate,
        running: Sequence[RunningRequest] = (),
        running_total: int = 0,
        waiting_total: int = 0,
        counters: dict[str, int] | None = None,
    ) -> DrainReport:
        """Records since the last drain (then forgotten), the cumulative counters and the engine's state.

        ``counters``: further cumulative counters kept elsewhere (the phase machine's).
        """
        stats = EngineStats(**{**self.counters, **(counters or {})})
        report = DrainReport(
            completions=list(self.completions),
            steps=list(self.steps),
            running=list(running),
            running_total=running_total,
            waiting_total=waiting_total,
            dropped_completions=self.dropped_completions,
            dropped_steps=self.dropped_steps,
            stats=stats,
            facts=facts,
            applied=applied,
        )
        self.completions.clear()
        self.steps.clear()
        self.dropped_completions = 0
        self.dropped_steps = 0
        return report


class TokenTimes:
    """Per running request: when its first output token came and its longest wait between two.

    The scheduler calls :meth:`emitted` once per step with the requests that got an
    output token in it (a decode, or the last chunk of a prompt) and :meth:`pop` when a
    request leaves, for its ``(ttft_s, stall_s)``. Wall-clock (``time.time``), like
    vLLM's request ``arrival_time``. A preempted request keeps its last token's time,
    so its recompute shows as one long stall, as its client saw it.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._first: dict[str, float] = {}
        self._last: dict[str, float] = {}
        self._gap: dict[str, float] = {}

    def emitted(self, request_ids: Sequence[str]) -> None:
        now = self.clock()
        last, gap = self._last, self._gap
        for rid in request_ids:
            prev = last.get(rid)
            if prev is None:
                self._first[rid] = now
                gap[rid] = 0.0
            elif now - prev > gap[rid]:
                gap[rid] = now - prev
            last[rid] = now

    def pop(self, request_id: str, arrival: float) -> tuple[float, float]:
        """``(ttft_s, stall_s)`` of a request that leaves ((0, 0) if it emitted nothing)."""
        first = self._first.pop(request_id, None)
        self._last.pop(request_id, None)
        stall = self._gap.pop(request_id, 0.0)
        return (0.0, 0.0) if first is None else (max(0.0, first - arrival), stall)
