"""Cancelled requests leave no engine work: the add_request guard and the lazily made batched stream.

The real engine's side is ``tests/engine/test_cancellation_asyncllm.py``; here the asyncio
behaviour, with Ray Serve LLM's own ``Batcher`` for the batched stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from ebplus.replicas.cancellation import guard_add_request, read_when_read


class Engine:
    """An ``AsyncLLM``'s two calls: adding takes ``add_s``; what was added and aborted is recorded."""

    def __init__(self, add_s: float, fail: bool = False) -> None:
        self.add_s, self.fail = add_s, fail
        self.added: list[str] = []
        self.aborted: list[tuple[str, bool]] = []

    async def add_request(self, request_id: str) -> Any:
        await asyncio.sleep(self.add_s)
        if self.fail:
            raise ValueError("admission refused")
        self.added.append(request_id)
        return SimpleNamespace(request_id=f"internal-{request_id}")

    async def abort(self, request_id: str, internal: bool = False) -> None:
        self.aborted.append((request_id, internal))


async def cancelled_while_adding(engine: Engine, request_id: str, after_s: float) -> None:
    """``add_request`` started, its caller cancelled ``after_s`` later: the caller gets its cancellation."""
    caller = asyncio.ensure_future(engine.add_request(request_id))
    await asyncio.sleep(after_s)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller


def test_a_caller_cancelled_while_adding_gets_its_cancellation_and_the_request_is_aborted_once_in() -> None:
    engine = Engine(add_s=0.2)
    guard_add_request(engine)

    async def run() -> None:
        await cancelled_while_adding(engine, "r1", after_s=0.05)
        assert engine.added == [] and engine.aborted == []  # at once: the adding is still under way
        await asyncio.sleep(0.3)

    asyncio.run(run())
    assert engine.added == ["r1"] and engine.aborted == [("internal-r1", True)]


def test_an_uncancelled_call_is_unchanged_and_a_failed_one_aborts_nothing() -> None:
    engine = Engine(add_s=0.0)
    guard_add_request(engine)
    guard_add_request(engine)  # once only
    assert asyncio.run(engine.add_request("r1")).request_id == "internal-r1"
    refusing = Engine(add_s=0.1, fail=True)
    guard_add_request(refusing)

    async def run() -> None:
        await cancelled_while_adding(refusing, "r2", after_s=0.02)
        await asyncio.sleep(0.2)

    asyncio.run(run())
    assert engine.aborted == [] and refusing.aborted == []
    with pytest.raises(ValueError, match="admission refused"):
        asyncio.run(refusing.add_request("r3"))


async def engine_stream(state: list[str], items: int = 5, gap_s: float = 0.02) -> AsyncIterator[str]:
    """An engine's answer stream; ``state`` says whether it started and how it ended."""
    state.append("started")
    try:
        for i in range(items):
            await asyncio.sleep(gap_s)
            yield f"chunk {i}"
        state.append("finished")
    except (asyncio.CancelledError, GeneratorExit):
        state.append("cancelled")
        raise


def batched(source: AsyncIterator[str]) -> AsyncIterator[Any]:
    """Ray Serve LLM's batched stream of ``source`` (what ``LLMServer._batch_output_stream`` makes)."""
    from ray.llm._internal.serve.utils.batcher import Batcher

    return Batcher(source, interval_ms=10).stream()


def test_ray_serve_llms_batched_stream_reads_the_engine_even_when_nobody_reads_it() -> None:
    """The window the lazy stream closes (if this fails, Ray's Batcher no longer reads eagerly)."""
    state: list[str] = []

    async def run() -> None:
        dropped = batched(engine_stream(state))
        del dropped  # a request cancelled before Serve read its stream
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):  # however busy the machine, the engine runs to its end
                while len(state) < 2:
                    await asyncio.sleep(0.01)

    asyncio.run(run())
    assert state == ["started", "finished"]


def test_a_stream_made_when_read_never_starts_the_engine_if_it_is_never_read() -> None:
    state: list[str] = []

    async def run() -> None:
        dropped = read_when_read(batched, engine_stream(state))
        del dropped
        await asyncio.sleep(0.3)

    asyncio.run(run())
    assert state == []


def test_a_stream_made_when_read_cancels_the_engine_when_its_reader_closes_it() -> None:
    state: list[str] = []

    async def run() -> list[Any]:
        stream = read_when_read(batched, engine_stream(state, items=50))
        first = await anext(stream)
        await stream.aclose()
        await asyncio.sleep(0.1)
        return first

    assert asyncio.run(run())  # a batch of chunks came through
    assert state == ["started", "cancelled"]


def test_a_stream_made_when_read_is_read_whole() -> None:
    state: list[str] = []

    async def run() -> list[str]:
        return [chunk async for batch in read_when_read(batched, engine_stream(state)) for chunk in batch]

    assert asyncio.run(run()) == [f"chunk {i}" for i in range(5)]
    assert state == ["started", "finished"]
