"""The step-cost probe: the paper's Figure 1 and a fitted hardware profile, with PyTorch alone.

Times engine steps of a decoder of a real shape (:mod:`benchmarks.gpu_probe_model`) the way
the paper's Figure 1 does, in three sweeps:

* ``prefill``: prefill-only steps over ``n_tok`` (prompts of ``prompt_len`` tokens, the paper's 512);
* ``decode``: decode-only steps over batch size and context length;
* ``mixed``: steps of ``n_tok`` tokens (Figure 1 holds the batch at 1024) over the decode share
  ``r = n_decode / n_tok`` from 0 to 1, decodes at ``mixed_context`` tokens of context.

Each point has warm-up steps, then ``repeats`` timed ones (CUDA events on a GPU; on a CPU, with
one torch thread, that thread's CPU time, which other processes on a shared machine do not
inflate as they do its wall time); the points of the three sweeps are interleaved in a shuffled order,
so a slow period of the machine spreads over all of them and a run cut at its time budget still
covers every sweep. It writes ``DIR/points.csv`` (every point, its spread and its samples) and
``DIR/run.yaml`` (device, shape, plan), then :mod:`benchmarks.gpu_probe_report` fits the profile
with the project's own fitter and writes ``DIR/profile.yaml``, the plot and ``DIR/report.md``.
The measuring needs only PyTorch, numpy and PyYAML; the fit needs the installed project, the
plot matplotlib: where either is missing (the GPU machine) the report is made later with
``--report DIR``.

Run (from the repository root): ``python -m benchmarks.gpu_probe --device cpu --out DIR``
(``make gpu-probe``), ``--device cuda`` on a GPU, ``--dry-run`` for the plan alone.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import os
import platform
import random
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import yaml

GIB = 2**30
#: The share of device memory an engine may use (vLLM's default ``gpu_memory_utilization``) and
#: what it keeps back for activations: the profile's KV capacity, as the calibrated profiles count it.
MEMORY_UTILIZATION = 0.9
RESERVE_BYTES = 2 * GIB


@dataclass(frozen=True)
class ProbePlan:
    """What one probe run measures."""

    model: str
    probe_layers: int  # layers built and run; times are scaled to the model's depth
    dtype: str
    block_size: int
    prompt_len: int  # prefill steps are made of prompts of this length (and one shorter rest)
    prefill_tokens: tuple[int, ...]
    decode_batches: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    mixed_tokens: tuple[int, ...]  # n_tok of the mixed sweep
    mixed_shares: tuple[float, ...]  # decode shares r, 0 and 1 included (the curve's ends)
    mixed_context: int
    figure_tokens: int  # the mixed n_tok whose curve is Figure 1 (r* is read from it)
    warmup: int
    repeats: int
    budget_s: float  # measuring stops here (the points left are skipped and listed)
    threads: int | None = None  # CPU threads of torch (None: its default)
    seed: int = 0


SHARES = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0)

#: ``--device cuda``: the paper's setting (Llama-3.1-8B, 512-token prompts, batch 1024); memory
#: ~36 GiB (4 layers' KV pools for 1,024 sequences at 2,048 tokens), a roofline estimate of ~1 min.
#: The budget stops measuring at 3 minutes, so two runs (both shapes) fit the 8 minutes of one
#: command on the lent H200 even if the estimate is 3x off.
CUDA_PLAN = ProbePlan(
    model="llama-3.1-8b",
    probe_layers=4,
    dtype="bfloat16",
    block_size=16,
    prompt_len=512,
    prefill_tokens=(64, 128, 256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192),
    decode_batches=(1, 8, 32, 64, 128, 256, 512, 768, 1024),
    decode_contexts=(256, 512, 1024, 2048),
    mixed_tokens=(512, 1024, 2048),
    mixed_shares=SHARES,
    mixed_context=512,
    figure_tokens=1024,
    warmup=3,
    repeats=10,
    budget_s=180.0,
)

#: ``--device cpu``: the same sweeps on the tiny shape, scaled down (seconds on 2 cores).
CPU_PLAN = ProbePlan(
    model="tiny",
    probe_layers=2,
    dtype="float32",
    block_size=16,
    prompt_len=64,
    prefill_tokens=(8, 16, 24, 32, 48, 64, 96, 128, 192, 256),
    decode_batches=(1, 2, 4, 8, 16),
    decode_contexts=(16, 64, 128),
    mixed_tokens=(64, 128),
    mixed_shares=(0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
    mixed_context=64,
    figure_tokens=128,
    warmup=2,
    repeats=15,  # the fastest of many: on a shared machine most repeats of a short step are slowed
    budget_s=120.0,
    # one thread: on a shared 2-core machine a second OpenMP thread waits on a busy core at every
    # barrier (steps 10x slower and erratic); one thread's steps are slower but steady, and timed
    # by its own CPU time
    threads=1,
)

PLANS = {"cuda": CUDA_PLAN, "cpu": CPU_PLAN}


@dataclass(frozen=True)
class Point:
    sweep: str  # prefill, decode, mixed
    prompts: tuple[int, ...]
    batch: int
    context: int

    @property
    def tokens(self) -> int:
        return sum(self.prompts) + self.batch

    @property
    def kind(self) -> str:
        return "mixed" if self.prompts and self.batch else ("decode" if self.batch else "prefill")

    @property
    def share(self) -> float:
        return self.batch / self.tokens


def prompts_of(tokens: int, prompt_len: int) -> tuple[int, ...]:
    """``tokens`` prefill tokens as whole prompts of ``prompt_len`` and one shorter rest."""
    whole, rest = divmod(tokens, prompt_len)
    return (prompt_len,) * whole + ((rest,) if rest else ())


def points_of(plan: ProbePlan) -> list[Point]:
    """Every point of the plan, in measuring order: shuffled within a sweep, sweeps interleaved."""
    sweeps = {
        "prefill": [Point("prefill", prompts_of(n, plan.prompt_len), 0, 0) for n in plan.prefill_tokens],
        "decode": [Point("decode", (), b, c) for b in plan.decode_batches for c in plan.decode_contexts],
        "mixed": [
            Point("mixed", prompts_of(n - d, plan.prompt_len), d, plan.mixed_context if d else 0)
            for n in plan.mixed_tokens
            for d in (round(r * n) for r in plan.mixed_shares)
        ],
    }
    rng = random.Random(plan.seed)
    for pts in sweeps.values():
        rng.shuffle(pts)
    longest = max(len(p) for p in sweeps.values())
    order = []
    for i in range(longest):  # round robin, each sweep spread evenly over the run
        for pts in sweeps.values():
            j = i * len(pts) // longest
            if i == 0 or j != (i - 1) * len(pts) // longest:
                order.append(pts[j])
    return order


# --------------------------------------------------------------------------- sizing


@dataclass(frozen=True)
class Roofline:
    """A device's rough speed, for the plan's time estimate only (never for a figure)."""

    flops: float  # reachable dense FLOP/s in the probe's dtype
    bandwidth: float  # reachable memory bytes/s
    per_kernel: float  # seconds of eager launch overhead per kernel
    startup: float  # seconds of import, device init, weight init and warm-up


ROOFLINES = {
    "cuda": Roofline(
        flops=0.7 * 790e12, bandwidth=0.8 * 4.3e12, per_kernel=8e-6, startup=40.0
    ),  # an H200 as measured there
    "cpu": Roofline(flops=1.5e10, bandwidth=1e10, per_kernel=2e-5, startup=5.0),
}


def estimate_step(shape, plan: ProbePlan, p: Point, dtype_bytes: int, roof: Roofline) -> float:
    """Seconds of one measured step (``probe_layers`` layers and the rest) by a roofline."""
    s = shape
    t = p.tokens
    flops = 2 * t * s.layer_params + sum(2 * n * n * s.heads * s.head_dim for n in p.prompts)
    flops += 4 * p.batch * (p.context + 1) * s.heads * s.head_dim
    kv_read = p.batch * (p.context + 1) * 2 * s.kv_heads * s.head_dim * dtype_bytes
    act = t * (8 * s.hidden + 4 * s.intermediate) * dtype_bytes
    bytes_ = s.layer_params * dtype_bytes + kv_read + act
    kernels = 24 + 2 * len(set(p.prompts)) + (3 if p.batch else 0)
    layer = max(flops / roof.flops, bytes_ / roof.bandwidth) + kernels * roof.per_kernel
    logits = len(p.prompts) + p.batch
    rest = max(2 * logits * s.vocab * s.hidden / roof.flops, s.vocab * s.hidden * dtype_bytes / roof.bandwidth)
    return plan.probe_layers * layer + rest + 6 * roof.per_kernel


def plan_summary(plan: ProbePlan, shape, device: str, dtype_bytes: int, pool_blocks: int) -> dict:
    """Point counts, steps, memory and the estimated time of a plan (printed before a run)."""
    pts = points_of(plan)
    roof = ROOFLINES[device]
    steps = plan.warmup + plan.repeats
    seconds = sum(estimate_step(shape, plan, p, dtype_bytes, roof) for p in pts) * steps
    kv_bytes = pool_blocks * plan.block_size * shape.kv_bytes_per_token(dtype_bytes, plan.probe_layers)
    weight_bytes = (plan.probe_layers * shape.layer_params + 2 * shape.vocab * shape.hidden) * dtype_bytes
    return {
        "points": {sweep: sum(p.sweep == sweep for p in pts) for sweep in ("prefill", "decode", "mixed")},
        "points_total": len(pts),
        "steps": len(pts) * steps,
        "warmup": plan.warmup,
        "repeats": plan.repeats,
        "memory_gib": round((kv_bytes + weight_bytes) / GIB, 2),
        "estimated_s": round(roof.startup + seconds + 0.005 * len(pts), 1),
        "budget_s": plan.budget_s,
    }


def kv_capacity_tokens(shape, dtype_bytes: int, memory_bytes: float) -> int:
    """KV tokens the full model leaves room for: ``(0.9 x memory - weights - 2 GiB) / KV bytes per token``."""
    free = MEMORY_UTILIZATION * memory_bytes - shape.params * dtype_bytes - RESERVE_BYTES
    return max(1, int(free // shape.kv_bytes_per_token(dtype_bytes)))


# --------------------------------------------------------------------------- measuring


def device_facts(torch, device) -> dict:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {
            "device": torch.cuda.get_device_name(device),
            "memory_bytes": int(props.total_memory),
            "cuda": torch.version.cuda,
            "driver": _nvidia_driver(),
        }
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    threads = torch.get_num_threads()
    name = f"cpu ({_cpu_name()}, {threads} thread{'s' if threads != 1 else ''})"
    return {"device": name, "memory_bytes": int(memory)}


def _cpu_name() -> str:
    try:  # the profiler's reading of it (ebplus.profiler on main), where the project is installed
        from ebplus.profiler.profiling import cpu_model
    except ImportError:
        return platform.machine()
    return cpu_model()


def _nvidia_driver() -> str:
    try:
        return Path("/proc/driver/nvidia/version").read_text().split("\n")[0].strip()
    except OSError:
        return ""


@dataclass
class Measured:
    point: Point
    seconds: list[float] = field(default_factory=list)  # at full depth
    measured: list[float] = field(default_factory=list)  # as run (probe_layers)
    stack: list[float] = field(default_factory=list)  # the layer stack of each


def measure(plan: ProbePlan, device_name: str, log=print) -> tuple[list[Measured], dict]:
    """Run the plan; returns the measured points and the run's facts (``run.yaml``)."""
    import torch

    from benchmarks.gpu_probe_model import SHAPES, Decoder, Step, choose_backends, pool_blocks_for

    started = time.monotonic()
    device = torch.device(device_name)
    dtype = getattr(torch, plan.dtype)
    shape = SHAPES[plan.model]
    pts = points_of(plan)
    steps = {p: Step(p.prompts, p.batch, p.context) for p in pts}
    blocks = pool_blocks_for(list(steps.values()), plan.block_size)
    torch.manual_seed(plan.seed)
    if plan.threads is not None:
        torch.set_num_threads(plan.threads)
    with torch.inference_mode():
        decoder = Decoder(shape, plan.probe_layers, blocks, plan.block_size, device, dtype, plan.seed)
        if device.type == "cpu" and torch.get_num_threads() == 1:
            decoder.cpu_clock = time.thread_time  # all of a step runs in this thread: its CPU time
        timer = "CUDA events" if device.type == "cuda" else decoder.cpu_clock.__name__
        backends = choose_backends(decoder)
        built = time.monotonic() - started
        log(
            f"built {plan.probe_layers} of {shape.layers} layers of {shape.name} on {device_name} in {built:.1f} s; "
            f"SDPA backends {backends}"
        )
        max_position = max(max(plan.decode_contexts), plan.mixed_context, plan.prompt_len) + 1
        # warm-up of every kernel family before the first timed point
        for p in sorted(pts, key=lambda q: -q.tokens)[:3] + [p for p in pts if p.kind == "decode"][:1]:
            inp = decoder.inputs(steps[p], max_position)
            for _ in range(2):
                decoder.step(inp)
        out: list[Measured] = []
        skipped: list[Point] = []
        failed: list[dict] = []
        deadline = started + plan.budget_s
        for i, p in enumerate(pts):
            if time.monotonic() > deadline:
                skipped = pts[i:]
                log(f"time budget of {plan.budget_s:.0f} s reached: {len(skipped)} points skipped")
                break
            m = Measured(p)
            try:
                inp = decoder.inputs(steps[p], max_position)
                for _ in range(plan.warmup):
                    decoder.step(inp)
                for _ in range(plan.repeats):
                    full, total, stack = decoder.step(inp)
                    m.seconds.append(full)
                    m.measured.append(total)
                    m.stack.append(stack)
            except RuntimeError as exc:  # out of memory, a kernel that rejects a shape: lose the point, not the run
                failed.append({**asdict(p), "error": str(exc).splitlines()[0][:300]})
                log(f"point {p} failed: {failed[-1]['error']}")
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                continue
            out.append(m)
            if (i + 1) % 20 == 0:
                log(f"{i + 1}/{len(pts)} points ({time.monotonic() - started:.0f} s)")
    facts = {
        **device_facts(torch, device),
        "torch": str(torch.__version__),
        "python": platform.python_version(),
        "sdpa_backends": backends,
        "timer": timer,
        "model": asdict(shape),
        "plan": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(plan).items()},
        "pool_blocks": blocks,
        # timezone.utc, not datetime.UTC (3.11+): the GPU machine's Python may be older
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),  # noqa: UP017
        "build_s": round(built, 2),
        "elapsed_s": round(time.monotonic() - started, 2),
        "points_measured": len(out),
        "points_skipped": [asdict(p) for p in skipped],
        "points_failed": failed,
        "dtype_bytes": torch.tensor([], dtype=dtype).element_size(),
    }
    facts["kv_capacity_tokens"] = kv_capacity_tokens(shape, facts["dtype_bytes"], facts["memory_bytes"])
    return out, facts


CSV_FIELDS = (
    "sweep", "kind", "prefill_tokens", "decode_tokens", "tokens", "r", "prompts", "prompt_len", "batch", "context",
    "kv_tokens", "repeats", "median_s", "min_s", "p10_s", "p90_s", "max_s", "measured_median_s", "stack_median_s",
    "samples_s",
)  # fmt: skip


def write_points(path: Path, measured: list[Measured]) -> None:
    """``points.csv``: one row per point; seconds at the model's full depth; ``samples_s`` every repeat."""
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for m in measured:
            p, s = m.point, np.asarray(m.seconds)
            w.writerow({
                "sweep": p.sweep, "kind": p.kind, "prefill_tokens": sum(p.prompts), "decode_tokens": p.batch,
                "tokens": p.tokens, "r": f"{p.share:.4f}", "prompts": len(p.prompts),
                "prompt_len": max(p.prompts, default=0), "batch": p.batch, "context": p.context,
                "kv_tokens": p.batch * p.context, "repeats": len(s),
                "median_s": f"{np.median(s):.6e}", "min_s": f"{s.min():.6e}",
                "p10_s": f"{np.percentile(s, 10):.6e}", "p90_s": f"{np.percentile(s, 90):.6e}",
                "max_s": f"{s.max():.6e}", "measured_median_s": f"{np.median(m.measured):.6e}",
                "stack_median_s": f"{np.median(m.stack):.6e}", "samples_s": " ".join(f"{x:.6e}" for x in s),
            })  # fmt: skip


# --------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_probe", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=sorted(PLANS), default="cpu", help="cpu (tiny shape) or cuda (the real one)")
    ap.add_argument("--out", type=Path, help="output folder (points.csv, run.yaml, profile.yaml, report.md, plot)")
    ap.add_argument("--model", help="shape: llama-3.1-8b (Figure 1's), qwen3-8b (Table 4's) or tiny")
    ap.add_argument("--layers", type=int, help="layers to build and run (times are scaled to the model's depth)")
    ap.add_argument("--dtype", help="torch dtype of weights and KV (bfloat16 on cuda, float32 on cpu)")
    ap.add_argument("--repeats", type=int, help="timed steps per point")
    ap.add_argument("--warmup", type=int, help="untimed steps per point before them")
    ap.add_argument("--budget-s", type=float, help="stop measuring after this many seconds")
    ap.add_argument("--name", help="profile name (default gpu-probe-<device>-<model>)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and its estimated time; measure nothing")
    ap.add_argument("--report", type=Path, metavar="DIR", help="only (re)make DIR's profile and report from its points")
    ap.add_argument("--simulate", action="store_true", help="add the simulator table (needs the installed project)")
    return ap


def plan_from(args: argparse.Namespace) -> ProbePlan:
    plan = PLANS[args.device]
    changes = {k: v for k, v in {
        "model": args.model, "probe_layers": args.layers, "dtype": args.dtype, "repeats": args.repeats,
        "warmup": args.warmup, "budget_s": args.budget_s,
    }.items() if v is not None}  # fmt: skip
    return replace(plan, **changes)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    command = " ".join(["python -m benchmarks.gpu_probe", *argv])
    from benchmarks import gpu_probe_report as report

    if args.report is not None:
        report.make(args.report, simulate=args.simulate, name=args.name, command=command)
        return 0
    from benchmarks.gpu_probe_model import SHAPES, Step, pool_blocks_for

    plan = plan_from(args)
    if plan.model not in SHAPES:
        raise SystemExit(f"unknown --model {plan.model!r}: one of {sorted(SHAPES)}")
    shape = SHAPES[plan.model]
    dtype_bytes = 2 if plan.dtype in ("bfloat16", "float16") else 4
    pts = points_of(plan)
    blocks = pool_blocks_for([Step(p.prompts, p.batch, p.context) for p in pts], plan.block_size)
    summary = plan_summary(plan, shape, args.device, dtype_bytes, blocks)
    print(
        f"plan ({args.device}, {shape.name}, {plan.probe_layers} of {shape.layers} layers, {plan.dtype}): "
        + yaml.safe_dump(summary, default_flow_style=True, sort_keys=False).strip()
    )
    if args.dry_run:
        return 0
    if args.out is None:
        raise SystemExit("--out DIR is needed to measure")
    args.out.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    measured, facts = measure(plan, args.device)
    facts["command"] = command
    facts["plan_summary"] = summary
    facts["load_average_1min"] = {"before": round(load[0], 2), "after": round(os.getloadavg()[0], 2)}
    write_points(args.out / "points.csv", measured)
    (args.out / "run.yaml").write_text(yaml.safe_dump(facts, sort_keys=False))
    counts = {k: sum(m.point.sweep == k for m in measured) for k in ("prefill", "decode", "mixed")}
    print(
        f"measured {len(measured)} points {counts}, {sum(len(m.seconds) for m in measured)} timed steps, "
        f"in {facts['elapsed_s']:.1f} s (estimated {summary['estimated_s']} s); wrote {args.out}/points.csv, run.yaml"
    )
    report.make(args.out, simulate=args.simulate, name=args.name, command=command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
