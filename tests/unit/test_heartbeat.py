"""Heartbeats between replica and ingress: a slow answer is not a lost replica; a silent one is, within the deadline."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from ebplus.replicas.heartbeat import HEARTBEAT, NoProgress, ReplicaStalled, with_heartbeats, without_heartbeats


@contextlib.contextmanager
def recording_end(closed: list[str]) -> Iterator[None]:
    """Around an engine stream's body: records in ``closed`` whether it was cancelled or closed."""
    try:
        yield
    except asyncio.CancelledError:
        closed.append("cancelled")
        raise
    except GeneratorExit:
        closed.append("closed")
        raise


async def slow(items: list[str], gap_s: float, closed: list[str]) -> AsyncIterator[str]:
    """An engine stream: ``items``, ``gap_s`` apart; records how it ended."""
    with recording_end(closed):
        for item in items:
            await asyncio.sleep(gap_s)
            yield item
        closed.append("finished")


async def collect(stream: AsyncIterator) -> list:
    return [item async for item in stream]


def test_heartbeats_come_first_and_fill_the_gaps() -> None:
    closed: list[str] = []
    out = asyncio.run(collect(with_heartbeats(slow(["a", "b"], 0.25, closed), every_s=0.1)))
    assert out[0] == HEARTBEAT and [x for x in out if x != HEARTBEAT] == ["a", "b"]
    assert 2 <= out.count(HEARTBEAT) - 1 <= 6 and closed == ["finished"]


def test_a_fast_stream_gets_one_heartbeat_only() -> None:
    out = asyncio.run(collect(with_heartbeats(slow(["a", "b", "c"], 0.0, []), every_s=1.0)))
    assert out == [HEARTBEAT, "a", "b", "c"]


def test_a_slow_but_alive_replica_is_not_stalled() -> None:
    """Gaps of 0.5 s between items, a stall deadline of 0.3 s: heartbeats every 0.06 s keep it alive."""

    async def run() -> list:
        stream = with_heartbeats(slow(["a", "b", "c"], 0.5, []), every_s=0.06)
        return await collect(without_heartbeats(stream, stall_s=0.3))

    assert asyncio.run(run()) == ["a", "b", "c"]


async def accepted_then(items: list[str], gap_s: float, closed: list[str]) -> AsyncIterator[str]:
    """A replica that took the request (one heartbeat), then answers ``items`` ``gap_s`` apart without heartbeats."""
    yield HEARTBEAT
    async for item in slow(items, gap_s, closed):
        yield item


def test_a_silent_replica_is_given_up_on_within_the_deadline() -> None:
    closed: list[str] = []

    async def run() -> float:
        started = time.monotonic()
        with pytest.raises(ReplicaStalled, match="0.2 s"):
            # what the ingress sees of a replica whose node was lost after it took the request
            await collect(without_heartbeats(accepted_then(["a"], 60.0, closed), stall_s=0.2))
        return time.monotonic() - started

    assert asyncio.run(run()) < 1.0
    assert closed == ["cancelled"]  # the pending read was cancelled: Serve cancels the request


def test_a_request_waiting_for_a_replica_has_no_stall_deadline() -> None:
    """Before the first heartbeat the request may be queued for a free replica: back-pressure, not a loss."""

    async def queued() -> AsyncIterator[str]:
        await asyncio.sleep(0.5)  # longer than the stall deadline, in Serve's queue
        yield HEARTBEAT
        yield "a"

    assert asyncio.run(collect(without_heartbeats(queued(), stall_s=0.2))) == ["a"]


def test_closing_the_heartbeat_stream_aborts_the_engine_stream() -> None:
    """A client that goes away closes the replica's generator: the engine's request must end too."""
    closed: list[str] = []

    async def run() -> None:
        stream = with_heartbeats(slow(["a", "b"], 10.0, closed), every_s=0.05)
        assert await anext(stream) == HEARTBEAT
        assert await anext(stream) == HEARTBEAT  # the engine is still on its first item
        await stream.aclose()

    asyncio.run(run())
    assert closed == ["cancelled"]


class Running:
    """An engine stream already at work before it is read (Ray Serve LLM's batched stream is); records its close."""

    def __init__(self) -> None:
        self.closed = False

    def __aiter__(self) -> Running:
        return self

    async def __anext__(self) -> str:
        await asyncio.sleep(10.0)
        return "a"

    async def aclose(self) -> None:
        self.closed = True


def test_closing_at_the_first_heartbeat_closes_the_engine_stream() -> None:
    """A client gone while its first heartbeat is on the way: the engine stream is closed all the same."""
    engine = Running()

    async def run() -> None:
        stream = with_heartbeats(engine, every_s=0.05)
        assert await anext(stream) == HEARTBEAT
        await stream.aclose()

    asyncio.run(run())
    assert engine.closed


def test_items_that_look_like_text_pass_through() -> None:
    """Only the exact heartbeat is dropped: stream chunks (strings, lists) and responses are not."""

    async def source() -> AsyncIterator:
        for item in [HEARTBEAT, "data: {}\n\n", [HEARTBEAT, "x"], {"id": 1}, HEARTBEAT]:
            yield item

    assert asyncio.run(collect(without_heartbeats(source(), stall_s=1.0))) == ["data: {}\n\n", [HEARTBEAT, "x"], {"id": 1}]


def test_a_wedged_engine_under_a_live_replica_is_given_up_on_after_the_progress_deadline() -> None:
    """Heartbeats keep coming (the replica lives) but no token does: the progress deadline ends it."""
    closed: list[str] = []

    async def wedged() -> AsyncIterator[str]:
        yield HEARTBEAT
        yield "a"  # the first token ...
        try:
            while True:  # ... then heartbeats only
                await asyncio.sleep(0.02)
                yield HEARTBEAT
        finally:
            closed.append("closed")

    async def run() -> tuple[list, float]:
        out: list = []
        started = time.monotonic()
        with pytest.raises(NoProgress, match="0.3 s"):
            async for item in without_heartbeats(wedged(), stall_s=0.1, progress_s=0.3):
                out.append(item)
        return out, time.monotonic() - started

    out, took = asyncio.run(run())
    assert out == ["a"] and 0.3 <= took < 1.5 and closed == ["closed"]


def test_the_progress_deadline_starts_with_the_first_token_and_moves_with_each() -> None:
    """A long wait for the first token (an EB prefill phase) and steady tokens after it are not stuck."""

    async def steady() -> AsyncIterator[str]:
        yield HEARTBEAT
        await asyncio.sleep(0.8)  # longer than the progress deadline, before the first token
        yield "a"
        for item in ("b", "c", "d"):
            await asyncio.sleep(0.25)  # each gap well within it (a loaded machine oversleeps), together beyond it
            yield HEARTBEAT
            yield item

    async def run() -> list:
        return await collect(without_heartbeats(steady(), stall_s=2.0, progress_s=0.6))

    assert asyncio.run(run()) == ["a", "b", "c", "d"]


def test_a_client_leaving_as_the_next_token_lands_ends_the_read() -> None:
    """The client leaves (its task is cancelled) in the same turn of the loop as the engine's next token arrives.
    Python 3.11's ``asyncio.wait_for`` returns that token and drops the cancellation, so the read went on for a
    client that had gone (and its engine work with it); the read must end, cancelled, and close the stream."""

    async def main() -> tuple[bool, list[str], list[str]]:
        loop = asyncio.get_running_loop()
        tokens = [loop.create_future() for _ in range(3)]
        closed: list[str] = []
        got: list[str] = []

        async def engine() -> AsyncIterator[str]:
            with recording_end(closed):
                yield HEARTBEAT
                for token in tokens:
                    yield await token

        async def client() -> None:
            async for item in without_heartbeats(engine(), stall_s=5.0):
                got.append(item)

        reading = asyncio.create_task(client())
        tokens[0].set_result("a")
        while got != ["a"]:
            await asyncio.sleep(0)
        await asyncio.sleep(0.01)  # the read of the second token is pending
        tokens[1].set_result("b")
        reading.cancel()  # the same turn of the loop
        for _ in range(20):
            await asyncio.sleep(0)
        ended = reading.done()
        if not ended:  # the read went on: let it finish so the test ends
            tokens[2].set_result("c")
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(reading, 1.0)
        return ended and reading.cancelled(), got, closed

    ended, got, closed = asyncio.run(main())
    assert ended, f"the read went on after the client left: got {got}"
    assert closed, "the engine stream was not closed"
