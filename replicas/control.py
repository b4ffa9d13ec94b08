"""The replica process's channel to the EB+ scheduler inside vLLM's engine core.

vLLM runs the scheduler in the engine-core process (a separate process under
``AsyncLLM``). The engine core answers "utility" calls by method name;
``replicas/scheduler.py`` registers one, :data:`UTILITY`, that forwards to the
scheduler's ``ebplus_*`` methods. The call is asynchronous and served between
engine steps, so neither side blocks the other.

Contract of the scheduler methods (plain data only: it crosses a msgpack IPC):

* ``ebplus_apply(update: dict) -> dict`` — install ``{mode, active, k, n, version}``
  for the next step; returns what is applied (same keys).
* ``ebplus_applied() -> dict`` — the applied thresholds.
* ``ebplus_drain() -> dict`` — telemetry since the last drain: ``completions``
  (``[prompt_len, output_len, finish]`` rows), ``steps`` (``[prefill_tokens,
  decode_tokens, running, waiting, seconds, phase, kv_tokens]`` rows; six-field rows
  from an older scheduler read ``kv_tokens = 0``), ``dropped_completions``,
  ``dropped_steps``, cumulative ``stats`` (``steps_<phase>``, ``phase_switches``,
  ``kv_backoffs``, ``preemptions``), and the engine's facts ``kv_capacity_tokens``,
  ``max_num_seqs``, ``device``.
"""

from __future__ import annotations

from typing import Any

from ebplus.controller.telemetry import CompletionRecord, FinishReason, StepRecord

UTILITY = "ebplus_call"


def to_completion(record: tuple) -> CompletionRecord:
    """A ``completions`` row of ``ebplus_drain()`` as the controller's record."""
    prompt_len, output_len, finish = record
    return CompletionRecord(int(prompt_len), int(output_len), FinishReason(finish))


def to_step(record: tuple) -> StepRecord:
    """A ``steps`` row of ``ebplus_drain()`` as the controller's record (rows without KV tokens read 0)."""
    prefill, decode, running, waiting, seconds, phase, *kv = record
    kv_tokens = int(kv[0]) if kv else 0
    return StepRecord(int(prefill), int(decode), int(running), int(waiting), float(seconds), str(phase), kv_tokens)


class EngineControl:
    """Async client of the scheduler's ``ebplus_*`` methods through an ``AsyncLLM``."""

    def __init__(self, async_llm: Any) -> None:
        self._core = async_llm.engine_core

    async def _call(self, method: str, *args: Any) -> Any:
        return await self._core.call_utility_async(UTILITY, method, list(args))

    async def apply(self, update: dict) -> dict:
        return await self._call("ebplus_apply", update)

    async def applied(self) -> dict:
        return await self._call("ebplus_applied")

    async def drain(self) -> dict:
        return await self._call("ebplus_drain")
