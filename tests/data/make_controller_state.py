"""Write ``controller-state-<commit>.json``: the state an earlier controller persisted, written by that code.

* ``b0f895d``: the last release before the workload window and the crossover changed their
  persisted layout (both still under schema version 1); two replicas.
* ``1d4a85c``: schema version 2, the last code whose snapshot was a hand-built JSON text
  (``persistence.SnapshotWriter``, what the actor of a large fleet wrote); four replicas
  reporting running requests, an operator override, a forgotten replica kept aside.

Each runs the controller code of its commit on synthetic telemetry and saves what that code
persists. ``tests/unit/test_persistence_versions.py`` and the rolling-upgrade scenario
restore them with today's code.

    python tests/data/make_controller_state.py [COMMIT]   # needs the git history (git archive); default: all

Deterministic (seeded telemetry, an injected clock), but for how long the re-plans took (``update_seconds``)
and the last bits of fitted floats, which follow the BLAS build.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

# Each runs inside the old tree (its own `ebplus` package first on sys.path).
B0F895D = r'''
import json, random, sys
from ebplus.controller.config import ControllerConfig
from ebplus.controller.fleet import FleetController
from ebplus.controller.messages import CompletionRecord, EngineFacts, FinishReason, Registration, StepRecord, TelemetryBatch
from ebplus.controller.cost_model import CostModel

now = [1000.0]
config = ControllerConfig(update_every=40, min_samples=20, planner={"min_concurrency": 2, "cooldown": 0})
fleet = FleetController(config, clock=lambda: now[0])
prior = CostModel(alpha_p=1e-3, beta_p=1e-5, alpha_d=1e-2, beta_d=1e-5, beta_mb=(1e-5, 0.0, 0.0))
rng = random.Random(7)
replicas = ("rep-a", "rep-b")
for rid in replicas:
    facts = EngineFacts(kv_capacity_tokens=20000, max_num_seqs=16, device="cpu")
    fleet.register(Registration(replica_id=rid, mode="auto", facts=facts, prior=prior))
sent = {rid: [0, 0] for rid in replicas}
for _ in range(40):
    for rid in replicas:
        comps = []
        for _ in range(5):
            out = rng.randint(1, 48)
            comps.append(CompletionRecord(rng.randint(8, 24), min(out, 32), FinishReason.LENGTH if out >= 32 else FinishReason.STOP))
        steps = [StepRecord(rng.randint(0, 64), rng.randint(1, 8), rng.randint(1, 8), rng.randint(0, 4), 0.01 + rng.random() * 0.01)
                 for _ in range(20)]
        fleet.ingest(TelemetryBatch(replica_id=rid, completions=comps, steps=steps, applied_version=fleet.version,
                                    completions_from=sent[rid][0], steps_from=sent[rid][1]))
        sent[rid][0] += len(comps)
        sent[rid][1] += len(steps)
        now[0] += 0.25
sys.stdout.write(fleet.state().model_dump_json())
'''

D1D4A85C = r'''
import random, sys
from ebplus.controller import persistence, pieces
from ebplus.controller.config import ControllerConfig
from ebplus.controller.cost_model import CostModel
from ebplus.controller.fleet import FleetController
from ebplus.controller.messages import (CompletionRecord, EngineFacts, EngineStats, FinishReason, Registration,
                                        RunningRequest, StepRecord, TelemetryBatch)

now = [1000.0]
config = ControllerConfig(update_every=40, min_samples=20, history=24, planner={"min_concurrency": 2, "cooldown": 0})
fleet = FleetController(config, clock=lambda: now[0])
prior = CostModel(alpha_p=1e-3, beta_p=1e-5, alpha_d=1e-2, beta_d=1e-5, beta_mb=(1e-5, 0.0, 0.0))
rng = random.Random(11)
replicas = ("rep-a", "rep-b", "rep-c", "rep-d")
for i, rid in enumerate(replicas):
    facts = EngineFacts(kv_capacity_tokens=20000 + 4000 * i, max_num_seqs=16, device="cpu")
    fleet.register(Registration(replica_id=rid, mode=("auto", "auto", "eb", "mb")[i], facts=facts, prior=prior))
sent = {rid: [0, 0, 0] for rid in replicas}  # completions, steps, admissions
for round_ in range(30):
    for rid in replicas:
        if rid == "rep-d" and round_ >= 20:
            continue
        comps, seq = [], sent[rid][2]
        for j in range(5):
            out = rng.randint(1, 48)
            finish = FinishReason.LENGTH if out >= 32 else FinishReason.STOP
            comps.append(CompletionRecord(rng.randint(8, 24), min(out, 32), finish, seq + j, 32, rng.randint(0, 6),
                                          rng.random() * 0.05, rng.random() * 0.02))
        running = [RunningRequest(seq + 5 + j, rng.randint(8, 24), rng.randint(0, 20), 32) for j in range(3)]
        steps = [StepRecord(rng.randint(0, 64), rng.randint(1, 8), rng.randint(1, 8), rng.randint(0, 4),
                            0.01 + rng.random() * 0.01, rng.randint(0, 400)) for _ in range(20)]
        fleet.ingest(TelemetryBatch(replica_id=rid, completions=comps, steps=steps, running=running, running_total=3,
                                    applied_version=fleet.version, completions_from=sent[rid][0],
                                    steps_from=sent[rid][1], stats=EngineStats(steps_prefill=round_, preemptions=round_ // 7)))
        sent[rid][0] += len(comps)
        sent[rid][1] += len(steps)
        sent[rid][2] += 5
        now[0] += 0.25
    if round_ == 12:
        fleet.set_override("rep-b", k=3, ttl_s=10**7)
    if round_ == 24:
        fleet.forget("rep-d")
fleet.rejected["duplicate"] += 2
sys.stdout.write(pieces.run(persistence.SnapshotWriter().pieces(fleet)))
'''

GENERATORS = {"b0f895d": B0F895D, "1d4a85c": D1D4A85C}


def write(commit: str) -> Path:
    """Run ``commit``'s generator in that commit's tree; the file written."""
    with tempfile.TemporaryDirectory() as tmp:
        tree, pkg = Path(tmp) / "tree", Path(tmp) / "pkg" / "ebplus"
        tree.mkdir()
        archive = subprocess.run(["git", "archive", commit], cwd=HERE.parents[1], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        pkg.mkdir(parents=True)
        for name in (tree / "ebplus").glob("*.py"):  # the old package layout: role folders under `ebplus`
            (pkg / name.name).write_bytes(name.read_bytes())
        for role in ("controller", "replicas", "deploy", "bench", "dashboards"):
            (pkg / role).symlink_to(tree / role)
        env = {**os.environ, "PYTHONPATH": str(pkg.parent)}
        state = subprocess.run([sys.executable, "-c", GENERATORS[commit]], cwd=tmp, env=env, check=True,
                               capture_output=True, text=True).stdout
    out = HERE / f"controller-state-{commit}.json"
    out.write_text(json.dumps(json.loads(state), separators=(",", ":")) + "\n")
    return out


def main() -> int:
    for commit in sys.argv[1:] or list(GENERATORS):
        print(write(commit))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
