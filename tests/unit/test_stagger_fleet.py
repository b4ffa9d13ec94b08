"""Staggered windows end to end in-process: the controller's decision in ``/admin/thresholds``'s view and
``/metrics``, and the fleet simulator running the timed windows the controller set."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from factories import batch, registration
from prometheus_client.parser import text_string_to_metric_families

from ebplus.controller.config import ControllerConfig
from ebplus.controller.cost_model import CostModel, resolve_profile
from ebplus.controller.exporter import render
from ebplus.controller.fleet import FleetController
from ebplus.controller.messages import CompletionRecord, FinishReason, Mode, StepRecord
from ebplus.deploy.routing import make_router
from ebplus.simulator.fleet import FleetSimulator
from ebplus.simulator.sim import Policy, SimConfig
from ebplus.simulator.workloads import build_requests, load_source

H200 = CostModel(
    alpha_p=1.2786e-3, beta_p=2.4853e-5, alpha_d=8.921e-3, beta_d=4.586e-5, beta_mb=(2.494e-5, 5.193e-5, 1.478e-5)
)


def fleet(setting: str, replicas: int = 2, mode: Mode = Mode.EB) -> FleetController:
    fc = FleetController(ControllerConfig(stagger=setting))
    ids = [f"r{i}" for i in range(replicas)]
    for rid in ids:
        fc.register(registration(rid, mode, 2_000_000, 256, H200, device="NVIDIA H200"))
    rng = np.random.default_rng(0)
    for _ in range(3):
        for rid in ids:
            comps = tuple(CompletionRecord(512, int(o), FinishReason.STOP) for o in rng.geometric(1 / 256, 60))
            steps = (StepRecord(4096, 0, 500, 600, 0.1), *[StepRecord(0, 200, 200, 300, 0.02)] * 20)
            fc.ingest(batch(rid, comps, steps, applied_version=fc.version))
    fc.recompute()
    return fc


def gauges(fc: FleetController) -> dict[tuple[str, str], float]:
    out = {}
    for fam in text_string_to_metric_families(render(fc.snapshot(), "m").decode()):
        for s in fam.samples:
            if s.name.startswith("ebplus_stagger"):
                out[(s.name, s.labels.get("ReplicaId", ""))] = s.value
    return out


def test_on_is_in_the_thresholds_view_and_the_metrics() -> None:
    fc = fleet("on")
    snap = fc.snapshot()
    assert snap.stagger is not None and snap.stagger.on and snap.stagger.period_s > 0
    assert {rid: r.stagger_phase for rid, r in snap.replicas.items()} == {"r0": 0.0, "r1": 0.5}
    assert all(r.stagger_period_s == snap.stagger.period_s for r in snap.replicas.values())
    assert fc.thresholds("r1").stagger_phase == 0.5  # what the replica is sent
    g = gauges(fc)
    assert g[("ebplus_stagger_on", "")] == 1.0
    assert g[("ebplus_stagger_phase", "r1")] == 0.5
    assert g[("ebplus_stagger_period_seconds", "r0")] == snap.stagger.period_s


def test_off_single_replica_and_mb_fleets_are_not_staggered() -> None:
    for fc in (fleet("on", replicas=1), fleet("on", mode=Mode.MB), fleet("off")):
        snap = fc.snapshot()
        assert snap.stagger is not None and not snap.stagger.on and snap.stagger.reason
        assert all(r.stagger_period_s == 0.0 for r in snap.replicas.values())
        assert gauges(fc)[("ebplus_stagger_on", "")] == 0.0


def test_the_thresholds_view_reads_back_the_stagger() -> None:
    view = fleet("on").snapshot().replicas["r1"]
    assert view.message().stagger_phase == 0.5


def run(setting: str) -> FleetSimulator:
    reqs = build_requests(load_source("paper"), seed=3, requests=1600, rate=150.0)
    config = SimConfig(policy=Policy.EB, n=256, controller=ControllerConfig(stagger=setting))
    sim = FleetSimulator([resolve_profile("h200")], reqs, config, 4, make_router("default", 3, stale_s=math.inf))
    sim.run()
    return sim


def test_the_fleet_simulator_runs_the_controllers_stagger() -> None:
    on, off = run("on"), run("off")
    assert sum(s.machine.stats.stagger_windows for s in on.replicas) > 0
    assert sum(s.machine.stats.stagger_windows for s in off.replicas) == 0
    phases = sorted(s.machine.thresholds.stagger_phase for s in on.replicas)
    assert phases == [0.0, 0.25, 0.5, 0.75]
    assert sum(s.finished for s in on.replicas) == 1600  # every request served once


def test_the_command_line_turns_the_stagger_off() -> None:
    args = ["--profile", "h200", "--workload", "paper", "--policy", "eb", "--rate", "150", "--requests", "1600",
            "--replicas", "4", "--seed", "3", "--json"]  # fmt: skip
    on, off = (subprocess.run([sys.executable, "-m", "ebplus.cli", "sim", "run", *args, "--stagger", s],
                              capture_output=True, text=True) for s in ("on", "off"))  # fmt: skip
    assert on.returncode == 0 and off.returncode == 0, on.stderr + off.stderr
    assert json.loads(on.stdout)["windows_opened"] > json.loads(off.stdout)["windows_opened"]  # the timed windows


def test_the_decode_jump_stops_at_the_slots() -> None:
    """Runs of identical decode steps are advanced at once; a staggered slot inside one must still open its
    window on time, so the run matches the one stepped singly (to float rounding, as without the stagger)."""
    reqs = build_requests(load_source("paper"), seed=3, requests=1200, rate=150.0)
    runs = []
    for jump in (True, False):
        config = SimConfig(policy=Policy.EB, n=256, jump=jump, controller=ControllerConfig(stagger="on"))
        sim = FleetSimulator([resolve_profile("h200")], reqs, config, 4, make_router("default", 3, stale_s=math.inf))
        runs.append((sim.run().as_json(), sum(s.machine.stats.stagger_windows for s in sim.replicas)))
    (jumped, timed), (stepped, timed_stepped) = runs
    assert timed == timed_stepped > 0 and jumped["windows_opened"] == stepped["windows_opened"]
    for key in ("ttft_p50_s", "ttft_p99_s", "tok_per_s"):
        assert jumped[key] == pytest.approx(stepped[key], rel=1e-9)
