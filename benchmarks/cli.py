"""``ebplus bench sim`` and ``ebplus bench overhead``: the benchmark suites that make the docs' figures.

They run from a checkout (this folder is not installed): ``make bench-sim``,
``python -m benchmarks bench sim``. Heavy imports happen inside the run functions.
"""

from __future__ import annotations

import argparse

from benchmarks.outputs import RAW_DIR, SUMMARY_DIR
from ebplus.arguments import positive_int


def register(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser(
        "sim",
        help="run the simulator benchmark grid and write tables and plots",
        description=(
            "Run every profile x setting x policy of the simulator benchmark: synthetic saturated "
            "workloads (decode-heavy, balanced, prefill-heavy), the paper's (512,256) traffic at "
            "c = 32/512/2048, and the distribution- and concurrency-shift schedules, under mb, v0, "
            "EB with the best fixed k (a sweep), online EB and EB+. Writes a markdown table, a JSON "
            "file and PNG plots to --out."
        ),
    )
    b.add_argument(
        "--out",
        default=str(SUMMARY_DIR),
        help=f"directory of the table and plots (default {SUMMARY_DIR}; the raw JSON goes to {RAW_DIR})",
    )
    b.add_argument(
        "--profiles",
        default=None,
        help=(
            "comma-separated profile names (default: every shipped calibrated profile; the pinned scenarios "
            "h200-switch and rtx-pro-6000-mixcurve run only when named)"
        ),
    )
    b.add_argument("--quick", action="store_true", help="small runs and a coarse sweep (a smoke test, ~1 min)")
    b.add_argument("--workers", type=positive_int, default=None, help="processes (default: CPU count)")
    b.add_argument("--seed", type=int, default=0, help="first random seed (default 0)")
    b.add_argument(
        "--seeds",
        type=positive_int,
        default=None,
        help="request seeds each value is averaged over (default 3; 1 with --quick)",
    )
    b.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    b.set_defaults(run=run_bench_sim)

    from benchmarks import overhead

    o = sub.add_parser(
        "overhead",
        help="measure what the serving plane costs: ebplus serve vs plain vLLM and Ray Serve LLM",
        description=overhead.__doc__.split("\n\n")[0] + " " + overhead.__doc__.split("\n\n")[2],
    )
    overhead.add_arguments(o)
    o.set_defaults(run=run_bench_overhead)


def run_bench_sim(args: argparse.Namespace) -> int:
    from benchmarks.bench_sim import main as bench_main

    return bench_main(args)


def run_bench_overhead(args: argparse.Namespace) -> int:
    from benchmarks.overhead import run

    return run(args, args.command_line)
