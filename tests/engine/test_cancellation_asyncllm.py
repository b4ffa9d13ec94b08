"""A caller cancelled while its request is being added to a real AsyncLLM leaves no work in the engine.

The cancellation is made to land where vLLM's ``add_request`` awaits the engine core
for one sequence (the only one of an ``n = 1`` request; the fourth of an ``n = 16``
one), the window ``ebplus.replicas.cancellation`` exists for. What the engine did with each sequence
is read from our scheduler's own telemetry (``EngineControl.drain``).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import async_llm

from ebplus.controller.messages import FinishReason

pytestmark = pytest.mark.engine

#: (sequences of the request, sequences handed to the engine core when the caller is cancelled)
SHAPES = ((1, 1), (16, 4))


def stock_ending(n: int) -> FinishReason | None:
    """How stock vLLM ends the sequences it was given for a caller cancelled in ``add_request``: in full
    for nobody, except an ``n > 1`` request from 0.32 on (it aborts the parent itself); ``None``: a
    release this tier does not run."""
    import vllm

    from ebplus.replicas.compat import series

    release = series(vllm.__version__)
    if release == (0, 29) or (release == (0, 32) and n == 1):
        return FinishReason.LENGTH
    return FinishReason.ABORT if release == (0, 32) else None


async def leave_while_adding(
    engine: Any, control: Any, request_id: str, n: int, leave_after: int
) -> Counter[FinishReason]:
    """Cancel a ``generate`` call while its ``add_request`` is in progress; how its sequences ended."""
    from vllm import SamplingParams

    core = engine.engine_core
    send = core.add_request_async
    sent = 0
    caller: asyncio.Task | None = None

    async def send_then_leave(request: Any) -> None:
        nonlocal sent
        await send(request)
        sent += 1
        if sent == leave_after:
            assert caller is not None
            caller.cancel()  # the client left (Serve cancels the handler) ...
            await asyncio.sleep(0)  # ... and it lands here when the handler is the one adding

    async def call() -> None:
        params = SamplingParams(n=n, max_tokens=128, ignore_eos=True, temperature=1.0, seed=1)
        async for _ in engine.generate("tell me everything", params, request_id):
            pass

    core.add_request_async = send_then_leave
    try:
        caller = asyncio.ensure_future(call())
        with pytest.raises(asyncio.CancelledError):
            await caller
        deadline = time.monotonic() + 60
        ended: Counter[FinishReason] = Counter()
        while time.monotonic() < deadline:
            ended.update(r.finish for r in (await control.drain()).completions)
            if engine.output_processor.get_num_unfinished_requests() == 0 and sum(ended.values()) >= sent:
                break
            await asyncio.sleep(0.1)
        return ended
    finally:
        core.add_request_async = send


def test_a_caller_cancelled_while_its_request_is_added_leaves_no_work(tiny_model: Path) -> None:
    """For each of :data:`SHAPES`, on one engine. Stock: what was already in the engine is generated in full
    for nobody, except where vLLM closed the window itself (:func:`stock_ending`; if this half fails, a
    release changed it). Guarded: every sequence of the request is aborted and none is finished."""

    async def scenario() -> None:
        from ebplus.replicas.cancellation import guard_add_request
        from ebplus.replicas.control import EngineControl

        async with async_llm(tiny_model, {}) as engine:
            control = EngineControl(engine)
            for n, leave_after in SHAPES:
                stock = await leave_while_adding(engine, control, f"stock-n{n}", n, leave_after)
                expected = stock_ending(n)
                if expected is not None:
                    assert stock == {expected: leave_after}, (n, stock)
            guard_add_request(engine)
            guard_add_request(engine)  # a second guard (a second server over one engine) changes nothing
            for n, leave_after in SHAPES:
                guarded = await leave_while_adding(engine, control, f"guarded-n{n}", n, leave_after)
                assert guarded == {FinishReason.ABORT: n}, (n, guarded)
            assert engine.output_processor.get_num_unfinished_requests() == 0

    asyncio.run(scenario())
