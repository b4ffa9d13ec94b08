"""The phase-aware router on a live deployment: what it reads and decides, and the loss of its board actor."""

from __future__ import annotations

import time

import httpx

from harness.cluster import Cluster
from harness.deployment import ROOT, Deployment
from harness.load import BackgroundLoad
from harness.waiting import wait_until

ROUTING_CONFIG = ROOT / "tests" / "e2e" / "routing.yaml"


def router_view(dep: Deployment) -> dict:
    """``GET /admin/routing``'s one router (one model, one ingress replica): policy, counters, boards.

    Serve makes a handle's router at the handle's first request: send one before asking (:func:`wait_boards`).
    """
    reply = httpx.get(f"{dep.base_url}/admin/routing", headers=dep.admin_headers, timeout=10)
    reply.raise_for_status()
    routers = reply.json()["routers"]
    if len(routers) != 1:
        raise AssertionError(f"expected one board router in the ingress, got {len(routers)}")
    return routers[0]


def boards_fresh(view: dict, replicas: int, max_age_s: float) -> bool:
    boards = view["boards"]
    return len(boards) == replicas and all(b["age_s"] < max_age_s for b in boards.values())


def wait_boards(dep: Deployment, replicas: int, timeout_s: float = 120) -> dict:
    """One request (the ingress's router exists from then on), then the router's view once it holds a fresh
    board of every replica."""
    reply = httpx.post(f"{dep.base_url}/v1/completions", headers=dep.api_headers, timeout=120,
                       json={"model": dep.model, "prompt": "Routers start here.", "max_tokens": 4})  # fmt: skip
    reply.raise_for_status()
    stale_s = dep.config.replicas.routing.stale_s

    def fresh() -> dict | None:
        view = router_view(dep)
        return view if boards_fresh(view, replicas, stale_s) else None

    return wait_until("a fresh board of every replica", fresh, timeout_s)


def scenario_board_loss(dep: Deployment, cluster: Cluster, replicas: int) -> dict:
    """Kill the board actor (Ray restarts it) under a closed-loop load: requests keep being served by Ray's
    power of two choices while the boards are stale, and the boards come back whole.

    Figures: the load's summary (``failed`` must be 0), the fallbacks the kill caused, and the seconds from the
    kill until every replica's board is fresh again and routing stopped falling back.
    """
    import ray

    from ebplus.replicas.board import get_board

    stale_s = dep.config.replicas.routing.stale_s
    wait_boards(dep, replicas)
    with BackgroundLoad(dep, duration_s=300, concurrency=6, max_tokens=24) as load:
        time.sleep(3)
        before = router_view(dep)
        board = get_board()
        assert board is not None, "no board actor in the cluster"
        ray.kill(board, no_restart=False)
        killed = time.monotonic()
        wait_until("routing to fall back", lambda: router_view(dep)["fallbacks"] > before["fallbacks"], 30)
        fell_back = time.monotonic() - killed

        def recovered() -> bool:
            first = router_view(dep)
            if not boards_fresh(first, replicas, stale_s / 4):
                return False
            time.sleep(1.0)
            second = router_view(dep)  # a second later: decisions made, none of them by the fallback
            return second["fallbacks"] == first["fallbacks"] and second["decisions"] > first["decisions"]

        wait_until("fresh boards after the board actor's restart", recovered, 60, every_s=0.5)
        back_s = time.monotonic() - killed
        after = router_view(dep)
        load.stop.set()
    result = load.join()
    return {
        "load": result.summary(),
        "failed": len(result.failed),
        "fallbacks_during_outage": after["fallbacks"] - before["fallbacks"],
        "seconds_until_fallback": round(fell_back, 2),
        "seconds_until_boards_back": round(back_s, 2),
        "decisions": after["decisions"] - before["decisions"],
    }
