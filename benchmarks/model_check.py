"""The closed forms against the simulator: TP_MB and TP_EB over concurrency 8..4096 (a bench-sim section).

The EB/MB decision compares two throughput predictions, so both must hold where
the decision is made. For each shipped profile and the paper's four synthetic
workloads (decode-heavy, balanced, prefill-heavy, paper; +-50% uniform lengths),
closed loop at concurrency ``c``, the simulator runs MB and EB(k0*) with ``N`` and
KV capacity large enough that neither binds (the closed forms model throughput, not
memory), and each is compared with its closed form at ``n = c``: MB priced with the
mix of step kinds it runs (:func:`ebplus.controller.theory.mb_steps`), EB with the
budget's prefill chunks (:func:`ebplus.controller.theory.tp_eb`), both with the KV
read cost folded at the workload's mean decode context, as the planner does.

    python -m benchmarks.model_check [--profiles h200,l40s] [--quick]
"""

from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from benchmarks.pinned import sim_profile
from ebplus.controller import theory
from ebplus.controller.cost_model import profile_names
from ebplus.simulator.sim import Policy, SimConfig, simulate
from ebplus.simulator.workloads import build_requests, load_source

WORKLOADS = ("decode-heavy", "balanced", "prefill-heavy", "paper")
CONCURRENCY = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
QUICK_CONCURRENCY = (8, 32, 512, 2048)
BUDGET = 8192


@dataclass(frozen=True)
class Check:
    profile: str
    workload: str
    c: int
    k: int
    mb_sim: float  # requests/s, steady state
    mb_model: float
    eb_sim: float
    eb_model: float

    @property
    def mb_error(self) -> float:
        return self.mb_model / self.mb_sim - 1.0

    @property
    def eb_error(self) -> float:
        return self.eb_model / self.eb_sim - 1.0


def check(profile: str, workload: str, c: int) -> Check:
    prof = sim_profile(profile).model_copy(update={"kv_capacity_tokens": 10**9})
    reqs = build_requests(load_source(workload), seed=0, requests=max(2000, 8 * c), concurrency=c)
    out = reqs.output_len.astype(float)
    mu_l, mu_o = float(reqs.input_len.mean()), float(out.mean())
    cost = prof.cost_model().folded(mu_l + float(np.mean(out * out)) / (2 * mu_o))
    k = min(c - 1, max(1, theory.k_star(theory.theta0(1 / mu_o, cost.alpha_p, cost.alpha_d), c)))
    n = max(CONCURRENCY)
    mb = simulate(prof, reqs, SimConfig(policy=Policy.MB, n=n, budget=BUDGET)).steady_req_per_s()
    eb = simulate(prof, reqs, SimConfig(policy=Policy.EB, k=k, n=n, budget=BUDGET)).steady_req_per_s()
    return Check(
        profile,
        workload,
        c,
        k,
        mb,
        theory.mb_steps(c, cost.alpha_mixed, cost.beta_mb, cost.alpha_d, cost.beta_d, mu_l, mu_o, BUDGET).tp,
        eb,
        theory.tp_eb(k, c, cost.alpha_p, cost.alpha_d, cost.beta_p, cost.beta_d, mu_l, mu_o, BUDGET),
    )


def _check(args: tuple[str, str, int]) -> Check:
    return check(*args)


def rows(profiles: list[str], quick: bool = False, workers: int = 1) -> list[Check]:
    grid = [(p, w, c) for p in profiles for w in WORKLOADS for c in (QUICK_CONCURRENCY if quick else CONCURRENCY)]
    if workers <= 1:
        return [_check(g) for g in grid]
    with ProcessPoolExecutor(workers) as pool:
        return list(pool.map(_check, grid))


def markdown(checks: list[Check]) -> list[str]:
    out = [
        "| profile | workload | c | MB sim | MB model | error | EB(k0*) k | EB sim | EB model | error |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in checks:
        out.append(
            f"| {r.profile} | {r.workload} | {r.c} | {r.mb_sim:.4g} | {r.mb_model:.4g} | {r.mb_error:+.1%} | {r.k} | "
            f"{r.eb_sim:.4g} | {r.eb_model:.4g} | {r.eb_error:+.1%} |"
        )
    big = [r for r in checks if r.c >= 32]
    if big:
        worst = max(max(abs(r.mb_error), abs(r.eb_error)) for r in big)
        out += ["", f"Largest error at c >= 32: **{worst:.1%}** (requests/s, steady state)."]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", default=None, help="comma-separated profiles (default: all shipped)")
    parser.add_argument("--quick", action="store_true", help="four concurrencies instead of ten")
    parser.add_argument("--workers", type=int, default=1, help="processes")
    args = parser.parse_args(argv)
    profiles = args.profiles.split(",") if args.profiles else profile_names()
    print("\n".join(markdown(rows(profiles, args.quick, args.workers))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
