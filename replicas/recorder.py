"""The scheduler's telemetry: bounded buffers of step and completion rows, and counters.

Pure Python (no vLLM import) so it is unit-tested without an engine. The
scheduler subclass calls :meth:`TelemetryRecorder.scheduled` right after each
``schedule()``, :meth:`~TelemetryRecorder.updated` at the start of each
``update_from_output()`` and :meth:`~TelemetryRecorder.finished` for every
request that leaves the engine; the replica process takes everything since the
last call with :meth:`~TelemetryRecorder.drain` (an engine-core utility call).

Rows are lists, not tuples or dataclasses: they cross vLLM's msgpack IPC.

* step rows: ``[prefill_tokens, decode_tokens, running, waiting, seconds, kind, kv_tokens]``,
  ``running``/``waiting`` right after the step was scheduled (requests holding a
  slot during the step, and the queue left behind), ``kind`` one of
  ``prefill``/``decode``/``mixed`` from the tokens actually scheduled,
  ``kv_tokens`` the KV the step's decodes read (their summed context). Steps that
  schedule nothing produce no row (they are counted as ``steps_idle``, and as
  ``steps_empty_busy`` when requests were running or waiting).
* completion rows: ``[prompt_len, output_len, finish]`` with ``finish`` a
  :class:`controller.telemetry.FinishReason` value.

Step timing. A step's seconds are measured from the end of ``schedule()`` to
the start of ``update_from_output()`` for the same output, i.e. the model
forward and sampling, without the scheduler's own time. Under async scheduling
vLLM schedules step n+1 while step n runs, so a step's execution is taken to
start at ``max(its schedule exit, the previous update)``; ``update_from_output``
is called once per ``schedule()`` in FIFO order on both paths. The first
``warmup_steps`` timed steps of a fresh engine are not reported: their forwards
pay lazy initialisation (seconds on a CPU) and would only be outliers for the
controller's fit; they are counted as ``steps_warmup``.

Buffers are bounded deques: when full, the oldest row is dropped and counted
(``dropped_steps``/``dropped_completions`` in the next drain).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

#: Counters reported in every drain, in this order (never reset: exporters take deltas).
COUNTERS = (
    "steps_prefill",
    "steps_decode",
    "steps_mixed",
    "steps_idle",
    "steps_empty_busy",
    "steps_warmup",
    "preemptions",
    "schedule_seconds",
    "overhead_seconds",
)


def step_kind(prefill_tokens: int, decode_tokens: int) -> str:
    """``prefill``, ``decode``, ``mixed`` or ``idle`` from the tokens a step scheduled."""
    if prefill_tokens and decode_tokens:
        return "mixed"
    if prefill_tokens:
        return "prefill"
    return "decode" if decode_tokens else "idle"


@dataclass(slots=True)
class _Pending:
    key: object
    t_exit: float
    row: list | None  # None: an empty step (timed only to keep the FIFO aligned)


class TelemetryRecorder:
    """Bounded telemetry buffers plus cumulative counters.

    Args:
        capacity: rows kept per kind between drains.
        warmup_steps: timed (non-empty) steps at the start whose rows are withheld.
        clock: monotonic seconds; injected in tests.
    """

    def __init__(self, capacity: int, warmup_steps: int = 2, clock: Callable[[], float] = time.perf_counter) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.clock = clock
        self.steps: deque[list] = deque(maxlen=capacity)
        self.completions: deque[list] = deque(maxlen=capacity)
        self.dropped_steps = 0
        self.dropped_completions = 0
        self.counters: dict[str, float] = dict.fromkeys(COUNTERS, 0)
        self._warmup_left = warmup_steps
        self._pending: deque[_Pending] = deque()
        self._last_update = float("-inf")

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
    ) -> str:
        """One ``schedule()`` returned (``key`` identifies its output); returns the step kind.

        ``kv_tokens``: the KV tokens the step's decodes read (their summed context).
        """
        kind = step_kind(prefill_tokens, decode_tokens)
        c = self.counters
        c[f"steps_{kind}"] += 1
        c["preemptions"] += preempted
        if kind == "idle" and running + waiting > 0:
            c["steps_empty_busy"] += 1
        row = None if kind == "idle" else [prefill_tokens, decode_tokens, running, waiting, 0.0, kind, kv_tokens]
        self._pending.append(_Pending(key, t_exit, row))
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
        if pending.row is None:
            return
        if self._warmup_left > 0:
            self._warmup_left -= 1
            self.counters["steps_warmup"] += 1
            return
        pending.row[4] = max(now - start, 1e-9)
        self._append(self.steps, pending.row, "dropped_steps")

    def finished(self, prompt_len: int, output_len: int, finish: str) -> None:
        """A request left the engine (natural stop, length cap, abort or error)."""
        self._append(self.completions, [prompt_len, output_len, finish], "dropped_completions")

    def _append(self, buf: deque, row: list, dropped: str) -> None:
        if len(buf) == buf.maxlen:
            setattr(self, dropped, getattr(self, dropped) + 1)
        buf.append(row)

    # -- read out ---------------------------------------------------------

    def drain(self) -> dict:
        """Rows since the last drain (then forgotten) and the cumulative counters."""
        out = {
            "completions": list(self.completions),
            "steps": list(self.steps),
            "dropped_completions": self.dropped_completions,
            "dropped_steps": self.dropped_steps,
            "stats": dict(self.counters),
        }
        self.completions.clear()
        self.steps.clear()
        self.dropped_completions = 0
        self.dropped_steps = 0
        return out
