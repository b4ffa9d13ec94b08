"""How the workload estimate tracks the truth from a cold start (a section of ``ebplus bench sim``).

A replica starts empty under a deep queue (the paper's c = 2048): the first cohort is
admitted at once, and the controller's first estimate comes after 30 completions -
the cohort's shortest. For each update of an online-EB run this records how far
``mu_o`` (the mean realized output the closed forms use) is from the run's true mean,
and the preemptions over the run (a cold N sized for too little KV preempts the whole
first cohort's growth).

    python -m benchmarks.cold_start [--profiles h200,rtx-pro-6000] [--seeds 3,4,5]
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass

import numpy as np

from benchmarks.pinned import sim_profile
from ebplus.simulator.sim import Policy, SimConfig, simulate
from ebplus.simulator.workloads import build_requests, load_source

PROFILES = ("h200", "rtx-pro-6000")
WORKLOADS = ("paper", "geometric")
SEEDS = (3, 4, 5)


@dataclass(frozen=True)
class ColdStart:
    """One run: the estimate's relative error at each update, and the run's figures."""

    profile: str
    workload: str
    seed: int
    errors: list[float]  # mu_o / true mean - 1, per update, in order
    preemptions: int
    tok_per_s: float

    @property
    def first(self) -> float:
        return self.errors[0]

    @property
    def worst_under(self) -> float:
        return min(self.errors)

    @property
    def worst_from_third(self) -> float:
        return max(abs(e) for e in self.errors[2:])


def run(profile: str, workload: str, seed: int, concurrency: int = 2048, requests: int = 8000) -> ColdStart:
    prof = sim_profile(profile)
    reqs = build_requests(load_source(workload), seed=seed, requests=requests, concurrency=concurrency)
    res = simulate(prof, reqs, SimConfig(policy=Policy.EB, n=2048))
    assert res.controller is not None
    truth = float(np.mean(reqs.output_len))
    stamps, errors = set(), []
    for decision in res.controller.history:
        est = decision.estimate
        if est is not None and est.timestamp not in stamps:
            stamps.add(est.timestamp)
            errors.append(est.mu_o / truth - 1.0)
    return ColdStart(profile, workload, seed, errors, res.preemptions, res.tok_per_s)


def rows(profiles: tuple[str, ...] = PROFILES, seeds: tuple[int, ...] = SEEDS) -> list[ColdStart]:
    return [run(p, w, s) for p in profiles for w in WORKLOADS for s in seeds]


def markdown(runs: list[ColdStart]) -> list[str]:
    out = [
        "| profile | workload | seed | first update | worst underestimate | worst from the 3rd update | preemptions | tok/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        out.append(
            f"| {r.profile} | {r.workload} | {r.seed} | {r.first:+.1%} | {r.worst_under:+.1%} | "
            f"±{r.worst_from_third:.1%} | {r.preemptions} | {r.tok_per_s:,.0f} |"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", default=",".join(PROFILES), help="comma-separated profile names")
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="comma-separated request seeds")
    parser.add_argument("--json", action="store_true", help="print the runs as JSON lines")
    args = parser.parse_args(argv)
    runs = rows(tuple(args.profiles.split(",")), tuple(int(s) for s in args.seeds.split(",")))
    if args.json:
        import json

        for r in runs:
            print(json.dumps(asdict(r)))
    else:
        print("\n".join(markdown(runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
