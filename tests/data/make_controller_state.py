"""Write ``controller-state-b0f895d.json``: the state the previous release's controller persisted.

Runs the controller code of commit b0f895d (the last release before the workload
window and the crossover changed their persisted layout, both still under schema
version 1) on synthetic telemetry of two replicas, and saves what that code
persists. ``tests/unit/test_persistence_versions.py`` and the rolling-upgrade
scenario (``harness.rollout``) restore it with today's code.

    python tests/data/make_controller_state.py        # needs the git history (git archive)

Deterministic (seeded telemetry, an injected clock).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

COMMIT = "b0f895d"
HERE = Path(__file__).resolve().parent
OUT = HERE / f"controller-state-{COMMIT}.json"

# Runs inside the old tree (its own `ebplus` package first on sys.path).
GENERATE = r'''
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


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        tree, pkg = Path(tmp) / "tree", Path(tmp) / "pkg" / "ebplus"
        tree.mkdir()
        archive = subprocess.run(["git", "archive", COMMIT], cwd=HERE.parents[1], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        pkg.mkdir(parents=True)
        for name in (tree / "ebplus").glob("*.py"):  # the old package layout: role folders under `ebplus`
            (pkg / name.name).write_bytes(name.read_bytes())
        for role in ("controller", "replicas", "deploy", "bench", "dashboards"):
            (pkg / role).symlink_to(tree / role)
        env = {**os.environ, "PYTHONPATH": str(pkg.parent)}
        state = subprocess.run([sys.executable, "-c", GENERATE], cwd=tmp, env=env, check=True, capture_output=True, text=True).stdout
    OUT.write_text(json.dumps(json.loads(state), separators=(",", ":")) + "\n")
    print(OUT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
