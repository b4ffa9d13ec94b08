"""The phase boards' channel (replicas/board.py): what the board actor stores, refuses, forgets and hands routers."""

from __future__ import annotations

import asyncio
import time

import pytest

from ebplus.controller.messages import Mode, PhaseReport, RoutingHints, decode, encode
from ebplus.replicas import board
from ebplus.replicas.board import BoardActor, BoardStore


def report(running: int = 4, waiting: int = 0, read_at: float | None = None, **fields: object) -> bytes:
    values = dict(
        mode=Mode.EB,
        prefilling=False,
        running=running,
        waiting=waiting,
        n=8,
        k=2,
        freed=0,
        prefill_tokens=0,
        kv_tokens=100,
        decode_step_s=0.01,
        mean_output=50.0,
        mean_prompt=20.0,
        read_at=time.time() if read_at is None else read_at,
    )
    values.update(fields)
    return encode(PhaseReport(**values))


def test_a_router_gets_what_changed_since_its_version_and_who_is_on_the_board() -> None:
    store = BoardStore()
    assert store.publish("a", report(running=1))
    assert store.publish("b", report(running=2))
    version, newer, present, hints = store.since(0)
    assert (version, sorted(newer), sorted(present)) == (2, ["a", "b"], ["a", "b"])
    assert decode(hints, RoutingHints) == RoutingHints()
    store.publish("a", report(running=3))
    version, newer, present, _ = store.since(version)
    assert version == 3 and list(newer) == ["a"] and sorted(present) == ["a", "b"]
    assert decode(newer["a"], PhaseReport).running == 3
    store.leave("b")
    assert store.since(version)[2] == ["a"]


@pytest.mark.parametrize(
    "payload",
    [b"\x00garbage", encode(RoutingHints()), report(n=0), report(mode=Mode.MB)[:-3]],
    ids=["not-msgpack", "another-message", "out-of-bounds", "truncated"],
)
def test_a_report_that_does_not_decode_is_refused_and_counted(payload: bytes) -> None:
    store = BoardStore()
    assert not store.publish("a", payload)
    assert store.version == 0 and store.since(0)[1] == {} and sum(store.refused.values()) == 1


def test_a_silent_replica_leaves_the_board() -> None:
    now = [100.0]
    store = BoardStore(clock=lambda: now[0], forget_after_s=30.0)
    store.publish("a", report())
    store.publish("b", report())
    now[0] = 120.0
    store.publish("b", report())
    now[0] = 131.0  # a silent for 31 s, b for 11 s
    assert store.since(0)[2] == ["b"]


def test_hints_bump_the_version_only_when_they_change() -> None:
    store = BoardStore()
    store.set_hints(RoutingHints(p0=0.01, beta_p={"a": 1e-5}))
    store.set_hints(RoutingHints(p0=0.01, beta_p={"a": 1e-5}))
    assert store.version == 1
    assert decode(store.since(0)[3], RoutingHints).p0 == 0.01


def test_a_watch_answers_as_soon_as_a_report_arrives_and_waits_while_none_does() -> None:
    async def main() -> tuple[float, float, dict, dict]:
        hints = RoutingHints(p0=0.02)

        async def from_controller() -> RoutingHints:
            return hints

        actor = BoardActor(hints=from_controller)
        await actor.publish("z", report())
        await asyncio.sleep(0.05)  # the actor's hints task has run once
        waiting = asyncio.ensure_future(actor.watch(actor.store.version, timeout_s=5.0))
        await asyncio.sleep(0.05)
        t0 = time.perf_counter()
        await actor.publish("a", report())
        _, newer, _, _ = await waiting
        woke = time.perf_counter() - t0
        version = actor.store.version
        t0 = time.perf_counter()
        _, none, _, got_hints = await actor.watch(version, timeout_s=0.2)
        idle = time.perf_counter() - t0
        return woke, idle, newer, {"none": none, "hints": decode(got_hints, RoutingHints)}

    woke, idle, newer, rest = asyncio.run(main())
    assert list(newer) == ["a"] and woke < 0.5
    assert rest["none"] == {} and idle >= 0.19
    assert rest["hints"].p0 == 0.02  # fetched by the actor's own task, once it ran


def test_a_controller_that_does_not_answer_leaves_the_last_hints(caplog: pytest.LogCaptureFixture) -> None:
    calls = []

    async def flaky() -> RoutingHints:
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("controller restarting")
        return RoutingHints(p0=0.05)

    async def main(monkey: pytest.MonkeyPatch) -> RoutingHints:
        monkey.setattr(board, "HINTS_INTERVAL_S", 0.01)
        actor = BoardActor(hints=flaky)
        await actor.publish("a", report())
        await asyncio.sleep(0.1)
        return actor.store.hints

    with pytest.MonkeyPatch.context() as monkey:
        assert asyncio.run(main(monkey)).p0 == 0.05
    assert len(calls) > 2
    assert sum("no routing hints" in r.getMessage() for r in caplog.records) == 1  # once an outage


class _Remote:
    def __init__(self, fn) -> None:
        self.fn = fn

    def remote(self, *args: object):
        return self.fn(*args)


def test_a_replica_publishes_every_interval_and_goes_on_through_a_board_outage(monkeypatch) -> None:
    published: list[tuple[str, bytes]] = []
    up = [True]

    async def publish(rid: str, payload: bytes) -> bool:
        if not up[0]:
            raise ConnectionError("board actor restarting")
        published.append((rid, payload))
        return True

    handle = type("Handle", (), {"publish": _Remote(publish)})()
    monkeypatch.setattr(board, "get_board", lambda: handle)

    async def read() -> bytes:
        return report()

    async def published_more_than(count: int) -> None:  # waits for progress, not for a machine's speed
        async with asyncio.timeout(30):
            while len(published) <= count:
                await asyncio.sleep(0.01)

    async def main() -> None:
        task = asyncio.ensure_future(board.publish_forever("r1", read, 0.01))
        await published_more_than(3)  # every interval
        up[0] = False
        before = len(published)
        await asyncio.sleep(0.1)
        assert len(published) == before
        up[0] = True
        await published_more_than(before + 3)  # on again once the board is back
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert {rid for rid, _ in published} == {"r1"}
