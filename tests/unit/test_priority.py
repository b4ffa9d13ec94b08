"""The ingress's CPU priorities (:mod:`ebplus.deploy.priority`): what the ingress starts at, and the routers'
thread raised above the rest of the process, on real threads (in a child process: a raised niceness cannot be
lowered again without a privilege)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from ebplus.deploy.priority import (
    INGRESS_NICENESS_ENV,
    RAY_WORKER_NICENESS,
    ROUTER_NICENESS_ENV,
    SEPARATE_ROUTER_LOOP_ENV,
    ingress_env,
)


@pytest.mark.parametrize(
    ("ingress", "router", "start", "rest"),
    [("inherit", 0, 0, 15), ("inherit", 19, 15, 15), (5, 10, 5, 5), (12, 3, 3, 12)],
)
def test_the_ingress_starts_at_the_lower_setting_and_carries_both(ingress, router, start, rest) -> None:
    """Raising a niceness needs no privilege and lowering one does: the process starts at the lower of the two
    and the router raises what must run later."""
    assert ingress_env(ingress, router, board_routers=True) == {
        RAY_WORKER_NICENESS: str(start),
        ROUTER_NICENESS_ENV: str(router),
        INGRESS_NICENESS_ENV: str(rest),
    }


@pytest.mark.parametrize(("ingress", "expected"), [("inherit", {}), (4, {RAY_WORKER_NICENESS: "4"})])
def test_without_a_board_router_or_with_router_inherit_only_the_ingress_setting_counts(ingress, expected) -> None:
    """Ray's default router is Ray's code, which raises nothing: starting the ingress lower would leave all of
    it there."""
    assert ingress_env(ingress, 0, board_routers=False) == expected
    assert ingress_env(ingress, "inherit", board_routers=True) == expected


CHILD = textwrap.dedent(
    """
    import json, os, sys, threading
    from ebplus.deploy.priority import prioritize_router_thread

    env = json.loads(sys.argv[1])
    stop = threading.Event()
    others = [threading.Thread(target=stop.wait) for _ in range(3)]
    for t in others:
        t.start()
    start = os.getpriority(os.PRIO_PROCESS, 0)
    done = {}

    def route():
        done["first"] = prioritize_router_thread(env)
        done["again"] = prioritize_router_thread(env)
        done["router"] = os.getpriority(os.PRIO_PROCESS, 0)

    router = threading.Thread(target=route)
    router.start()
    router.join()
    nice = lambda t: os.getpriority(os.PRIO_PROCESS, t.native_id)
    print(json.dumps({
        "start": start, "router": done["router"], "others": [nice(t) for t in others],
        "main": os.getpriority(os.PRIO_PROCESS, threading.main_thread().native_id),
        "raised": done["first"].raised, "same": done["first"] == done["again"],
        "reported": done["first"].niceness,
    }))
    stop.set()
    """
)


def _run(env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(env)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize(("router", "rest"), [(0, 15), (19, 15), (4, 4)])
def test_the_router_thread_keeps_its_niceness_and_every_other_thread_goes_to_the_ingress(router, rest) -> None:
    """From the niceness the process started at (Ray's increment over the raylet's, here the test's), once
    per process: each model's router asks, and a second pass must not read the raised thread as the start."""
    got = _run({ROUTER_NICENESS_ENV: str(router), INGRESS_NICENESS_ENV: str(rest)})
    raylet = got["start"] - min(router, rest)
    assert got["router"] == got["reported"] == min(19, raylet + router)
    assert got["others"] == [min(19, raylet + rest)] * 3 and got["main"] == min(19, raylet + rest)
    assert got["raised"] >= (4 if rest > router else 0)  # three threads and the main one
    assert got["same"]


def test_routers_on_the_callers_loop_leave_their_thread_with_the_rest() -> None:
    """With Ray Serve's separate router loop off, the routers' thread also streams the responses: raising it
    alone would raise the ingress's work with it."""
    got = _run({ROUTER_NICENESS_ENV: "0", INGRESS_NICENESS_ENV: "15", SEPARATE_ROUTER_LOOP_ENV: "0"})
    assert got["router"] == got["main"] == min(19, got["start"] + 15)


def test_without_the_settings_in_the_environment_nothing_is_touched() -> None:
    from ebplus.deploy.priority import prioritize_router_thread

    assert prioritize_router_thread({}) is None and prioritize_router_thread({ROUTER_NICENESS_ENV: "0"}) is None
