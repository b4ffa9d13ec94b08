"""The replica's channel to the EB+ scheduler inside vLLM's engine core.

vLLM runs the scheduler in the engine-core process (a separate process under
``AsyncLLM``, or in-process for an ``LLM`` with
``VLLM_ENABLE_V1_MULTIPROCESSING=0``). The engine core answers "utility" calls by
method name; we add one, :data:`UTILITY`, that forwards to the scheduler's
``ebplus_*`` methods. The call is served between
engine steps, so neither side blocks the other.

Contract of the scheduler methods (arguments and results are msgpack bytes of
:mod:`ebplus.controller.messages`, the codec every hop uses):

* ``ebplus_apply(ThresholdUpdate) -> ThresholdUpdate`` - install thresholds for the
  next step (``n`` clamped to the start-up ``max_num_seqs``, ``k`` to ``n``); returns
  what is applied.
* ``ebplus_applied() -> ThresholdUpdate`` - the applied thresholds.
* ``ebplus_drain() -> DrainReport`` - telemetry since the last drain, a sample of
  the running requests, cumulative counters and the engine's facts.
* ``ebplus_board() -> PhaseReport`` - the engine's batching now, for the routers' phase boards.

The utility is installed by :func:`install_engine_utility`: vLLM calls it as our
``vllm.general_plugins`` entry point in every vLLM process (the sanctioned way to
add an engine-side method), and importing the scheduler module calls it too, so
the channel exists wherever the scheduler runs, whatever ``VLLM_PLUGINS`` allows.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from ebplus.controller.messages import DrainReport, ThresholdUpdate, decode, encode
from ebplus.controller.telemetry import decode_lenient

logger = logging.getLogger(__name__)

UTILITY = "ebplus_call"


def _ebplus_call(self: Any, method: str, args: list | tuple = ()) -> Any:
    """Engine-core utility: call ``scheduler.<method>(*args)``; only ``ebplus_*`` methods.

    Clients: ``AsyncLLM.engine_core.call_utility_async("ebplus_call", "ebplus_drain", [])``
    (see :class:`EngineControl`), ``LLM`` with a separate engine process:
    ``llm.llm_engine.engine_core.call_utility(...)``; in-process engines have no
    utility channel: call ``engine_core.engine_core.ebplus_call(...)``.
    """
    if not method.startswith("ebplus_"):
        raise ValueError(f"{UTILITY} only forwards ebplus_* methods, got {method!r}")
    scheduler = self.scheduler
    target = getattr(scheduler, method, None)
    if target is None:
        raise TypeError(f"the engine's scheduler is {type(scheduler).__name__}, not EBPlusScheduler")
    return target(*args)


def install_engine_utility() -> None:
    """Add :data:`UTILITY` to vLLM's ``EngineCore`` (idempotent; the ``vllm.general_plugins`` entry point).

    NOTE: vLLM answers utility calls with ``getattr(engine_core, name)`` and has no
    way to reach the scheduler, so we add one method. The signature must be
    ``(method, args)``: vLLM checks ``len(args)`` against the declared parameters,
    and ``*args`` would count as one. It only forwards to a scheduler that has the
    method, so installing it in an engine that does not run EB+ changes nothing; vLLM
    runs it in every process of every engine where this package is installed (unless
    ``VLLM_PLUGINS`` leaves it out), so it must not fail.
    """
    try:
        from vllm.v1.engine.core import EngineCore
    except ImportError:  # another vLLM layout: vLLM runs general plugins unguarded, so never fail its start
        return
    if getattr(EngineCore, UTILITY, None) is not _ebplus_call:
        setattr(EngineCore, UTILITY, _ebplus_call)


class EngineControl:
    """Async client of the scheduler's ``ebplus_*`` methods through an ``AsyncLLM``'s engine client."""

    def __init__(self, engine_client: Any) -> None:
        self._core = engine_client.engine_core

    async def _call(self, method: str, *args: Any) -> bytes:
        return await self._core.call_utility_async(UTILITY, method, list(args))

    async def apply(self, update: ThresholdUpdate) -> ThresholdUpdate:
        return decode(await self._call("ebplus_apply", encode(update)), ThresholdUpdate)

    async def applied(self) -> ThresholdUpdate:
        return decode(await self._call("ebplus_applied"), ThresholdUpdate)

    async def drain(self) -> DrainReport:
        return drained(await self._call("ebplus_drain"))

    async def board(self) -> bytes:
        """The scheduler's :class:`~ebplus.controller.messages.PhaseReport`, as wire bytes (published as they are)."""
        return await self._call("ebplus_board")


def drained(payload: bytes) -> DrainReport:
    """A drain's report, minus any record outside the wire limits (logged): the scheduler builds records
    unchecked, and one the controller would refuse must not cost the replica the rest of the drain."""
    refused: Counter[str] = Counter()
    report = decode_lenient(payload, DrainReport, refused)
    if refused:
        logger.warning("the engine reported records the controller would refuse, left out: %s", dict(refused))
    return report
