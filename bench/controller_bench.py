"""Controller micro-benchmarks: one full update, and telemetry ingestion with 8 replicas.

    python -m ebplus.bench.controller_bench [--repeats 200] [--replicas 8] [--json]

*Update*: a window of 500 output lengths -> Estimate -> theta*, k*, N* and the
EB/MB decision (what runs every 100 completions), timed alone
(``WorkloadEstimator.update`` + ``ThresholdPlanner.plan``) and through
``FleetController.recompute`` for all replicas (includes the cost-model refits).

*Ingestion*: batches of 64 completions and 64 steps per replica per push, round
robin over the replicas, through ``FleetController.ingest`` (validation, windows,
cost-model samples and the periodic updates all included).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from ebplus.bench import distributions as dist
from ebplus.controller.config import ControllerConfig, PlannerConfig
from ebplus.controller.cost_model import CostModel
from ebplus.controller.estimator import WorkloadEstimator
from ebplus.controller.fleet import FleetController
from ebplus.controller.messages import (
    CompletionRecord,
    EngineFacts,
    FinishReason,
    Mode,
    Registration,
    StepRecord,
    TelemetryBatch,
)
from ebplus.controller.planner import ThresholdPlanner

H200 = CostModel(
    alpha_p=1.2786e-3, beta_p=2.4853e-5, alpha_d=8.921e-3, beta_d=4.586e-5, beta_mb=(2.494e-5, 5.193e-5, 1.478e-5)
)


def _percentiles(samples: list[float]) -> dict[str, float]:
    ms = sorted(s * 1e3 for s in samples)
    return {
        "median_ms": statistics.median(ms),
        "p99_ms": ms[min(len(ms) - 1, int(0.99 * len(ms)))],
        "min_ms": ms[0],
    }


def bench_update(repeats: int, seed: int = 0) -> dict[str, float]:
    """Time estimator update + plan on a full window of 500 linear-hazard lengths."""
    rng = np.random.default_rng(seed)
    est = WorkloadEstimator(window=500, update_every=100, min_samples=30)
    planner = ThresholdPlanner(PlannerConfig(max_num_seqs=1024))
    outputs = dist.linear_hazard(rng, 0.004, 1e-5, 500 + repeats * 100)
    inputs = dist.uniform_jitter(rng, 512, 0.5, outputs.size)
    est.observe_many(inputs[:500], outputs[:500])
    samples = []
    for i in range(repeats):
        lo = 500 + i * 100
        est.observe_many(inputs[lo : lo + 100], outputs[lo : lo + 100])
        t0 = time.perf_counter()
        e = est.update()
        planner.plan(e, H200, kv_capacity_tokens=2_000_000, n_obs=1500)
        samples.append(time.perf_counter() - t0)
    return _percentiles(samples)


def _fleet(replicas: int) -> FleetController:
    fc = FleetController(ControllerConfig())
    for r in range(replicas):
        facts = EngineFacts(kv_capacity_tokens=2_000_000, max_num_seqs=1024, device="H200")
        fc.register(Registration(replica_id=f"replica-{r}", mode=Mode.AUTO, facts=facts, prior=H200))
    return fc


def _step(rng: np.random.Generator, j: int) -> StepRecord:
    """A realistic mix: 1/8 prefill-only, 1/8 mixed, the rest decode-only, with noise."""
    running = int(rng.integers(200, 1024))
    if j % 8 == 0:
        p, d = int(rng.integers(256, 8192)), 0
    elif j % 8 == 1:
        p, d = int(rng.integers(256, 8192)), running
    else:
        p, d = 0, running
    seconds = H200.step_seconds(p, d) * float(rng.lognormal(0.0, 0.05))
    return StepRecord(p, d, running, 300, seconds)


def _batches(replicas: int, pushes: int, per_batch: int, seed: int) -> list[TelemetryBatch]:
    rng = np.random.default_rng(seed)
    outs = dist.geometric(rng, 256, pushes * per_batch)
    ins = dist.uniform_jitter(rng, 512, 0.5, outs.size)
    batches = []
    for i in range(pushes):
        sl = slice(i * per_batch, (i + 1) * per_batch)
        comps = [CompletionRecord(int(a), int(b), FinishReason.STOP) for a, b in zip(ins[sl], outs[sl], strict=True)]
        steps = [_step(rng, j) for j in range(per_batch)]
        batches.append(TelemetryBatch(replica_id=f"replica-{i % replicas}", completions=comps, steps=steps))
    return batches


def bench_recompute(replicas: int, repeats: int, seed: int = 0) -> dict[str, float]:
    fc = _fleet(replicas)
    for b in _batches(replicas, 40, 64, seed):
        fc.ingest(b)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fc.recompute("bench")
        samples.append(time.perf_counter() - t0)
    return _percentiles(samples)


def bench_ingest(replicas: int, pushes: int, per_batch: int = 64, seed: int = 0) -> dict[str, float]:
    fc = _fleet(replicas)
    batches = _batches(replicas, pushes, per_batch, seed)
    t0 = time.perf_counter()
    for b in batches:
        fc.ingest(b)
    elapsed = time.perf_counter() - t0
    completions = pushes * per_batch
    return {
        "completions_per_s": completions / elapsed,
        "steps_per_s": completions / elapsed,
        "updates": fc.updates,
        "seconds": elapsed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=200, help="timed updates (default 200)")
    parser.add_argument("--replicas", type=int, default=8, help="simulated replicas (default 8)")
    parser.add_argument("--pushes", type=int, default=1000, help="telemetry batches to ingest (default 1000)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    result = {
        "update": bench_update(args.repeats),
        "recompute_fleet": {"replicas": args.replicas, **bench_recompute(args.replicas, max(20, args.repeats // 4))},
        "ingest": {"replicas": args.replicas, **bench_ingest(args.replicas, args.pushes)},
    }
    if args.json:
        print(json.dumps(result))
        return 0
    u, r, i = result["update"], result["recompute_fleet"], result["ingest"]
    print("one update (window 500 -> Estimate -> theta*, k*, N*, crossover):")
    print(f"  median {u['median_ms']:.3f} ms, p99 {u['p99_ms']:.3f} ms")
    print(f"fleet recompute, {r['replicas']} replicas (incl. staggered cost refits):")
    print(f"  median {r['median_ms']:.3f} ms, p99 {r['p99_ms']:.3f} ms")
    print(f"ingestion, {i['replicas']} replicas, batches of 64 completions + 64 steps:")
    print(f"  {i['completions_per_s']:,.0f} completions/s (+ as many steps/s), {i['updates']} updates")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
