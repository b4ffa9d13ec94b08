"""The fleet simulator (``simulator/fleet.py``): replicas behind a router, one controller for all."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from ebplus.controller.cost_model import resolve_profile
from ebplus.deploy.routing import PhaseAware, PhaseBoard, make_router
from ebplus.simulator.fleet import FleetSimulator, simulate_fleet
from ebplus.simulator.sim import Policy, SimConfig, simulate
from ebplus.simulator.workloads import build_requests, load_source

H200 = resolve_profile("h200")


def paper(n: int, rate: float | None = None, concurrency: int | None = None, seed: int = 3):
    return build_requests(load_source("paper"), seed=seed, requests=n, rate=rate, concurrency=concurrency)


@pytest.mark.parametrize("policy", ["mb", "eb+"])
@pytest.mark.parametrize("arrivals", [{"rate": 30.0}, {"concurrency": 24}])
def test_one_replica_behind_a_router_is_the_single_engine_to_the_last_bit(policy: str, arrivals: dict) -> None:
    config = SimConfig(policy=Policy(policy), n=128)
    alone = simulate(H200, paper(600, **arrivals), config).as_json()
    fleet = simulate_fleet([H200], paper(600, **arrivals), config, 1, make_router("default")).as_json()
    assert {key: fleet[key] for key in alone} == alone


def test_every_request_is_served_once_and_the_counts_add_up() -> None:
    reqs = paper(1500, rate=200.0)
    result = simulate_fleet([H200], reqs, SimConfig(policy=Policy.EB, k=16, n=128), 4, make_router("phase"))
    fleet = result.fleet
    assert sum(result.routed) == 1500 and min(result.routed) > 0
    assert np.isfinite(fleet.finish_s).all() and (fleet.first_token_s >= fleet.arrival_s).all()
    assert fleet.output_len.sum() == fleet.decode_tokens + 1500  # each first token comes with its prefill
    assert 0 < result.windows_short <= result.windows
    assert all(0 < occ <= 1 for occ in result.occupancy)
    data = result.as_json()
    assert data["replicas"] == 4 and data["router"] == "phase" and data["routed"] == result.routed


def test_the_replicas_share_one_controller_that_plans_each_of_them() -> None:
    sim = FleetSimulator([H200], paper(1200, rate=150.0), SimConfig(policy=Policy.EBPLUS, n=128), 3,
                         make_router("default"))  # fmt: skip
    result = sim.run()
    controller = result.fleet.controller
    assert controller is not None and set(controller.replicas) == {"sim-0", "sim-1", "sim-2"}
    assert controller.updates > 3


def test_a_mixed_fleet_takes_the_profiles_in_turn() -> None:
    rtx = resolve_profile("rtx-pro-6000")
    reqs = paper(300, rate=60.0)
    sim = FleetSimulator([H200, rtx], reqs, SimConfig(policy=Policy.MB, n=64), 3, make_router("least-loaded"))
    assert [s.profile.name for s in sim.replicas] == ["h200", rtx.name, "h200"]
    # each board prices a prompt with its own replica's cost model (the mean prompt until an estimate)
    board = sim.board(sim.replicas[1])
    assert board.cost == rtx.cost_model() and board.prompt_tokens == pytest.approx(reqs.input_len.mean())
    sim.run()


def test_the_phase_router_spares_the_decodes_of_an_mb_fleet_where_mixing_interferes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """8 RTX PRO 6000 replicas in MB at 95 % of their saturated rate: on this profile a prompt that turns a
    decode-only step into a mixed one slows its decodes more than one joining a mixed step. Sent where it
    delays the decodes least, the TPOT tail is below the default router's; with that delay zeroed (ties by
    load alone), above it."""
    rtx = resolve_profile("rtx-pro-6000")

    def tpot_p99(name: str) -> float:
        reqs = paper(3200, rate=0.95 * 8 * 4.1869)  # benchmarks/fleet_bench.py's capacity of one replica
        router = make_router(name, 3, stale_s=math.inf)
        return simulate_fleet([rtx], reqs, SimConfig(policy=Policy.MB), 8, router).as_json()["tpot_p99_s"]

    default = tpot_p99("default")
    assert tpot_p99("phase") < 0.99 * default
    monkeypatch.setattr(PhaseBoard, "join_delay_s", property(lambda self: 0.0))
    assert tpot_p99("phase") > 1.01 * default


def test_the_phase_router_cuts_the_ttft_tail_of_an_eb_fleet() -> None:
    """8 replicas in EB (k 32) at ~80 % of their saturated rate: deterministic for the seed. Throughput is the
    rate while requests still arrive (``loaded_tok_per_s``): over 750 requests a replica, tokens/s to the last
    completion moves by about 1 % with which replica drains last (docs/benchmarks/fleet.md)."""
    config = SimConfig(policy=Policy.EB, k=32)
    out, loaded = {}, {}
    for name in ("default", "phase"):
        router = make_router(name, 3, stale_s=math.inf)
        result = simulate_fleet([H200], paper(6000, rate=235.0), config, 8, router)
        out[name], loaded[name] = result.as_json(), result.fleet.loaded_tok_per_s()
    assert out["phase"]["ttft_p99_s"] < 0.8 * out["default"]["ttft_p99_s"], out
    assert loaded["phase"] >= 0.99 * loaded["default"], loaded  # no more than 1 % short


def test_bad_fleets_are_refused() -> None:
    with pytest.raises(ValueError, match="--replicas must be >= 1"):
        FleetSimulator([H200], paper(10), SimConfig(policy=Policy.MB), 0, make_router("default"))
    with pytest.raises(ValueError, match="at least one profile"):
        FleetSimulator([], paper(10), SimConfig(policy=Policy.MB), 2, make_router("default"))
    assert isinstance(make_router("phase"), PhaseAware)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ebplus.cli", "sim", "run", *args], capture_output=True, text=True)


def test_the_command_line_runs_a_fleet() -> None:
    done = _cli("--profile", "h200", "--workload", "paper", "--policy", "eb", "--k", "16", "--rate", "120",
                "--requests", "600", "--replicas", "3", "--router", "phase", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert {"ttft_p50_s", "ttft_p99_s", "tok_per_s", "replicas", "router", "windows_short_share"} <= set(data)
    assert data["replicas"] == 3 and sum(data["routed"]) == 600
    refused = _cli("--profile", "h200,l40s", "--workload", "paper", "--policy", "mb")
    assert refused.returncode == 2 and "several profiles need --replicas > 1" in refused.stderr
    unknown = _cli("--profile", "h200", "--workload", "paper", "--policy", "mb", "--replicas", "2", "--router", "x")
    assert unknown.returncode == 2 and "invalid choice: 'x'" in unknown.stderr
