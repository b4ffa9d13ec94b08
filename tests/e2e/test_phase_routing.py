"""The phase-aware router on a live deployment (``tests/e2e/routing.yaml``, port 18300).

Two replicas of the tiny model in EB publish their phase boards to the board actor; the ingress's router
(``ebplus.deploy.request_router.BoardRouter``, Serve's ``request_router_config``) reads them and picks by the
phase policy. Checked here: every request is served and the router decides from boards, not from the
fallback; and the board actor killed under load (Ray restarts it) fails no request, routing falls back to
power of two choices meanwhile and the boards are back well within 30 s. How much the router changes
latency is a benchmark's question (``benchmarks/routing_bench.py``), not a test's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import psutil
import pytest

import harness as rel
from harness.load import run_load
from harness.routing import ROUTING_CONFIG, router_view, scenario_board_loss, wait_boards

pytestmark = [pytest.mark.e2e]

ADMIN_TOKEN = "routing-admin-token-3f7a"
REPLICAS = 2


@pytest.fixture(scope="module")
def routed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[rel.Deployment]:
    with rel.deployed(ROUTING_CONFIG, tmp_path_factory.mktemp("routing") / "serve.log", ADMIN_TOKEN) as dep:
        yield dep


@pytest.mark.timeout(300)
def test_requests_are_routed_by_the_replicas_phase_boards(routed: rel.Deployment) -> None:
    # The deployment's first batches of this size are slow to come (a CPU engine's first pass at a shape), and a
    # board read between two of them can be older than stale_s: warm up first, and judge the router on a
    # deployment that serves at its pace.
    warm = asyncio.run(run_load(routed, requests=16, concurrency=8, max_tokens=8))
    print(f"\nwarm-up: {router_view(routed)['fallbacks']} fallbacks, {warm.summary()}")
    before = wait_boards(routed, REPLICAS)
    result = asyncio.run(run_load(routed, requests=48, concurrency=8, max_tokens=32))
    assert result.failed == [], result.summary()
    view = router_view(routed)
    print(f"\nrouting: {view}")
    assert view["policy"] == "phase"
    decided = view["decisions"] - before["decisions"]
    assert decided >= 48  # one at least per request (Ray asks again if a replica is full)
    assert view["fallbacks"] == before["fallbacks"]  # fresh boards throughout: the policy chose every time
    assert {b["mode"] for b in view["boards"].values()} == {"eb"}
    assert view["decision_us"]["n"] >= decided


def _decided(dep: rel.Deployment) -> None:
    """A routing decision, if none came before: the router's first one sets the ingress's threads' niceness."""
    asyncio.run(run_load(dep, requests=2, concurrency=2, max_tokens=4))


def test_the_engines_run_below_the_serving_plane(routed: rel.Deployment) -> None:
    """``replicas.engine_niceness: auto`` on CPU replicas: every thread of both engines (vLLM's engine core and
    its workers, what they started since included) at 19; the replicas and the ingress at Ray's 15."""
    _decided(routed)
    tree = psutil.Process(routed.pid).children(recursive=True)
    engines = [p for p in tree if p.name().startswith("VLLM::")]
    serving = [p for p in tree if "ServeReplica:" in " ".join(p.cmdline())]
    assert len(engines) >= REPLICAS
    assert len(serving) >= REPLICAS + 1  # the model replicas and the ingress
    assert {psutil.Process(t.id).nice() for p in engines for t in p.threads()} == {19}
    assert {p.nice() for p in serving} == {15}


def test_the_routers_thread_runs_above_the_rest_of_the_ingress(routed: rel.Deployment) -> None:
    """``http.router_niceness: 0`` (its default) with the ingress at Ray's 15: Ray starts the ingress at 0, and
    the router's first decision leaves its own thread there and raises the rest of the process to 15."""
    _decided(routed)
    thread = router_view(routed)["thread"]
    tree = psutil.Process(routed.pid).children(recursive=True)
    ingress = [p for p in tree if "EBPlusIngress" in " ".join(p.cmdline())]
    assert len(ingress) == 1 and thread is not None
    nice = {t.id: psutil.Process(t.id).nice() for t in ingress[0].threads()}
    assert nice[thread["id"]] == thread["niceness"] == 0
    assert ingress[0].nice() == 15  # its main thread
    # at 0: the router's thread and what it started since (its loop's executor)
    assert sum(n == 15 for n in nice.values()) > 2 * sum(n == 0 for n in nice.values()), nice


@pytest.mark.timeout(420)
def test_losing_the_board_actor_under_load_fails_no_request(routed: rel.Deployment) -> None:
    with rel.Cluster(routed) as cluster:
        out = scenario_board_loss(routed, cluster, REPLICAS)
    print(f"\nboard loss: {out}")
    assert out["failed"] == 0, out["load"]
    assert out["fallbacks_during_outage"] > 0  # the router noticed, and Ray's own policy served meanwhile
    assert out["seconds_until_boards_back"] < 30
