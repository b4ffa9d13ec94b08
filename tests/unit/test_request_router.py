"""The board router in a deployment (deploy/request_router.py): Ray Serve's ``RequestRouter`` over phase boards.

Driven as Ray Serve drives it (``initialize_state``, ``choose_replicas``, ``on_request_routed``,
``on_request_completed``), with the boards a board actor would hand it (``take``) and a fake actor for the
background watch. The policy's own choices are tests/unit/test_routing.py's; here: that the router asks the
policy with the boards as the replicas published them, counts what it sent since, falls back to Ray's power
of two choices without fresh boards, and follows the board actor through a restart.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest
from ray.serve._private.common import DeploymentHandleSource, DeploymentID
from ray.serve.request_router import ReplicaID

from ebplus.controller.messages import Mode, PhaseReport, RoutingHints, encode
from ebplus.deploy.request_router import BoardRouter
from ebplus.deploy.routing import PhaseBoard, make_router

DEPLOYMENT = DeploymentID(name="smollm2", app_name="ebplus")


@pytest.fixture(autouse=True)
def no_board_actor(monkeypatch: pytest.MonkeyPatch) -> None:
    """The background watch a first decision starts finds no board actor (tests hand the router its boards)."""
    patch_board(monkeypatch, lambda: None)


def patch_board(monkeypatch: pytest.MonkeyPatch, get_board: object) -> None:
    """Replace the board lookup the router's watch calls. Through the method's own globals: once Ray Serve has
    pickled the class by value in this process (``RequestRouterConfig``, as ``test_config`` does), cloudpickle
    has set the original class's methods to copies whose globals are not the module's."""
    monkeypatch.setitem(BoardRouter._watch.__globals__, "get_board", get_board)


def make(policy: str = "phase", stale_s: float = 2.0) -> BoardRouter:
    router = BoardRouter(deployment_id=DEPLOYMENT, handle_source=DeploymentHandleSource.UNKNOWN)
    router.initialize_state(policy=policy, stale_s=stale_s, interval_s=0.01)
    return router


def replica(rid: str) -> SimpleNamespace:
    return SimpleNamespace(replica_id=ReplicaID(unique_id=rid, deployment_id=DEPLOYMENT))


def report(**fields: object) -> PhaseReport:
    values = dict(mode=Mode.EB, prefilling=False, running=6, waiting=0, n=8, k=4, freed=0, prefill_tokens=0,
                  kv_tokens=600, decode_step_s=0.02, mean_output=100.0, mean_prompt=40.0, read_at=time.time())  # fmt: skip
    values.update(fields)
    return PhaseReport(**values)


def choose(router: BoardRouter, candidates: list[SimpleNamespace]) -> list[str]:
    async def run() -> list[str]:
        ranked = await router.choose_replicas(candidates)
        return [r.replica_id.unique_id for r in ranked[0]]

    return asyncio.run(run())


HINTS = RoutingHints(p0=0.01, beta_p={"a": 2e-5, "b": 2e-5})
COLD = RoutingHints()


def test_it_asks_the_policy_with_the_boards_the_replicas_published() -> None:
    # a decodes with 2 of its k = 4 slots free; b has just opened a window
    reports = {"a": report(running=6, freed=2), "b": report(running=4, prefilling=True)}
    router = make()
    router.take(2, {rid: encode(r) for rid, r in reports.items()}, list(reports), encode(HINTS))
    candidates = [replica("a"), replica("b")]
    assert choose(router, candidates) == ["b"]
    boards = [PhaseBoard.of(reports[rid], HINTS, rid) for rid in ("a", "b")]
    assert make_router("phase", stale_s=float("inf")).choose(boards, time.time()) == 1  # the same policy, directly
    assert router.decisions == 1 and router.fallbacks == 0
    view = router.view()
    assert view["boards"]["b"]["prefilling"] and view["decision_us"]["n"] == 1 and view["decision_us"]["p99"] > 0
    # the decision's own CPU time, beside its wall time: no more than it (a few µs apart: the clocks are read in turn)
    assert view["decision_cpu_us"]["n"] == 1 and 0 < view["decision_cpu_us"]["p99"] <= view["decision_us"]["p99"] + 5
    # the boards are built once per change, when the change arrives (off the request path): new hints reach the
    # next decision's boards
    assert all(b.view is not None and "waits" in b.view.__dict__ for b in router.boards.values())
    assert router.boards["a"].board(router.hints, "a").prefill_s_per_token == 2e-5
    router.take(2, {}, list(reports), encode(RoutingHints(p0=0.01, beta_p={"a": 5e-5})))
    assert router.boards["a"].board(router.hints, "a").prefill_s_per_token == 5e-5


def test_requests_it_sent_count_until_a_report_counts_them_or_they_complete() -> None:
    router = make()
    before = time.time() - 1.0
    router.take(1, {"a": encode(report(waiting=0, read_at=before))}, ["a"], encode(COLD))
    pending = SimpleNamespace(metadata=SimpleNamespace(internal_request_id="r1"))
    router.on_request_routed(pending, ReplicaID(unique_id="a", deployment_id=DEPLOYMENT), None)
    router.on_request_routed(SimpleNamespace(metadata=SimpleNamespace(internal_request_id="r2")),
                             ReplicaID(unique_id="a", deployment_id=DEPLOYMENT), None)  # fmt: skip
    assert router.view()["boards"]["a"]["waiting"] == 2
    board = PhaseBoard.of(router.boards["a"].report, router.hints, "a", len(router.boards["a"].leases))
    assert board.prefill_tokens == 2 * 40  # each leased request with the engine's mean prompt (no estimate here)
    router.on_request_completed(ReplicaID(unique_id="a", deployment_id=DEPLOYMENT), "r1")
    assert router.view()["boards"]["a"]["leased"] == 1
    # an older report (read before r2 reached the engine) still leaves it leased; a newer one counts it
    router.take(2, {"a": encode(report(waiting=0, read_at=before + 0.5))}, ["a"], encode(HINTS))
    assert router.view()["boards"]["a"]["leased"] == 1
    router.take(3, {"a": encode(report(waiting=1, read_at=time.time() + 1.0))}, ["a"], encode(HINTS))
    assert (router.view()["boards"]["a"]["leased"], router.view()["boards"]["a"]["waiting"]) == (0, 1)


@pytest.mark.parametrize("why", ["no-board", "stale"])
def test_without_fresh_boards_ray_picks_by_power_of_two_choices(why: str) -> None:
    router = make(stale_s=2.0)
    read_at = time.time() - (10.0 if why == "stale" else 0.0)
    boards = {"a": encode(report(read_at=read_at))}
    if why == "stale":
        boards["b"] = encode(report(read_at=read_at))
    router.take(1, boards, list(boards), encode(HINTS))
    chosen = choose(router, [replica("a"), replica("b"), replica("c")])
    # two distinct replicas drawn at random: Ray's own selection then takes the shorter queue
    assert len(chosen) == 2 and len(set(chosen)) == 2
    assert router.fallbacks == 1 and router.decisions == 1


def test_replicas_that_left_the_board_and_unreadable_reports_are_dropped() -> None:
    router = make()
    router.take(1, {"a": encode(report()), "b": encode(report())}, ["a", "b"], encode(HINTS))
    router.take(2, {"c": b"\x01junk"}, ["a", "c"], b"junk")
    assert sorted(router.boards) == ["a"]
    assert router.refused == 2 and router.hints == HINTS  # the last readable hints stay
    router.take(3, {}, ["a"], b"junk")  # the same hints bytes again: read once, counted once
    assert router.refused == 2
    router.take(4, {}, ["a"], encode(HINTS))
    assert router.refused == 2 and router.hints == HINTS


@pytest.mark.timeout(30)
def test_the_watch_follows_the_board_actor_through_a_restart(monkeypatch: pytest.MonkeyPatch) -> None:
    """A restarted actor counts versions from 0 again: the router asks it for everything once it sees that."""
    actor = SimpleNamespace(version=5, asked=[])

    async def watch(after: int, timeout_s: float) -> tuple:
        actor.asked.append(after)
        if after > actor.version:  # a real actor would wait for its version to pass ``after``
            await asyncio.sleep(0.01)
        rid = "a" if actor.version == 5 else "b"
        return actor.version, {rid: encode(report())} if after < actor.version else {}, [rid], encode(HINTS)

    handle = SimpleNamespace(watch=SimpleNamespace(remote=watch))
    patch_board(monkeypatch, lambda: handle)

    async def until(check, timeout_s: float = 10.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not check():
            assert asyncio.get_running_loop().time() < deadline, "the watch did not catch up"
            await asyncio.sleep(0.01)

    async def main() -> None:
        router = make()  # made on a running loop, as Serve makes it: its watch starts at once
        await until(lambda: sorted(router.boards) == ["a"])
        actor.version = 2  # restarted, with b's report
        await until(lambda: sorted(router.boards) == ["b"])
        router._watching.cancel()

    asyncio.run(main())
    assert actor.asked[0] == 0 and 5 in actor.asked and 0 in actor.asked[actor.asked.index(5) :]
