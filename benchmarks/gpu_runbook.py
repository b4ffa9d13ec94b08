"""GPU runbook: the paper's EB-vs-MB comparison and the sim-to-real table on one GPU node, step by step.

    python -m benchmarks.gpu_runbook [--model Qwen/Qwen2.5-0.5B-Instruct] [--out-dir benchmarks/results/gpu]
    python -m benchmarks.gpu_runbook --dry-run            # print the commands, check each, run nothing
    python -m benchmarks.gpu_runbook --device cpu --quick  # the same steps, small, on this CPU

Steps (``--steps``; each is one command of this project, printed before it runs):

1. ``install`` (only when asked): ``bash deploy/install.sh``, which installs the
   ``gpu`` extra (vLLM + Ray Serve LLM) on a machine where ``nvidia-smi`` sees a GPU.
2. ``profile``: ``ebplus profile`` fits the cost model (alpha, beta, beta_mb(r), the
   KV-read cost) on the real engine; the profile YAML goes to the output directory.
3. ``engine``: the engine benchmark (in-process, step by step) on chat prompts
   answered at their natural lengths: MB, EB at two fixed k, and ``auto`` (EB+ with the
   real controller, the fitted profile as its prior).
4. ``compare``: the simulator on the engine run's exact request lengths, concurrency,
   N and budget, with the fitted profile: the sim-to-real table (predicted vs
   measured throughput, TTFT, TPOT per policy).
5. ``paper``: the paper's Table 4 setting on the real deployment (``ebplus serve`` in
   mode mb, eb and auto; ``vllm bench serve``'s random (512, 256) +-50% prompts, every
   request to its length) at concurrency 32, 512 and 2048.
6. ``paper-sim``: the simulator on the same setting with the fitted profile.

At the end it prints (and writes to ``report.md``) the sim-to-real table and the
paper comparison: measured and simulated MB / EB / EB+ tokens/s and EB/MB per
concurrency. The engine configuration (``engine.yaml``) is written by the runbook
from ``--model``; edit it and pass ``--config`` to change the engine arguments.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

STEPS = ("install", "profile", "engine", "compare", "paper", "paper-sim")
DEFAULT_STEPS = "profile,engine,compare,paper,paper-sim"
PAPER_MODES = (("mb", "mb"), ("eb", "eb"), ("auto", "eb+"))  # deployment mode, simulator policy


@dataclass(frozen=True)
class Sizes:
    """How large each step runs: the full GPU plan, or a quick one that runs in minutes on 2 CPU cores."""

    engine: dict[str, Any]
    replicas: dict[str, Any]
    engine_requests: int
    engine_concurrency: int
    max_tokens: int
    k: tuple[int, int]
    repeats: int
    update_every: int
    paper: dict[int, int]  # concurrency -> requests
    input_len: int = 512
    output_len: int = 256


GPU = Sizes(
    engine={"dtype": "auto", "max_model_len": 4096, "max_num_seqs": 2048, "max_num_batched_tokens": 8192,
            "gpu_memory_utilization": 0.9},
    replicas={"accelerator": "gpu", "num_cpus": 1, "max_ongoing_requests": 4096, "max_queued_requests": 8192},
    engine_requests=6000, engine_concurrency=2560, max_tokens=512, k=(128, 512), repeats=3, update_every=100,
    paper={32: 500, 512: 2500, 2048: 6000},
)  # fmt: skip
CPU_QUICK = Sizes(
    engine={"dtype": "float32", "max_model_len": 2048, "max_num_seqs": 16, "max_num_batched_tokens": 512,
            "enforce_eager": True, "cpu_kv_cache_gib": 1},
    replicas={"accelerator": "cpu", "num_cpus": 0, "max_ongoing_requests": 64, "max_queued_requests": 256},
    engine_requests=24, engine_concurrency=24, max_tokens=16, k=(2, 8), repeats=1, update_every=8,
    paper={8: 16}, input_len=64, output_len=16,
)  # fmt: skip
CPU_FULL = Sizes(
    engine=CPU_QUICK.engine | {"max_model_len": 2048, "max_num_seqs": 64, "max_num_batched_tokens": 2048},
    replicas=CPU_QUICK.replicas,
    engine_requests=256, engine_concurrency=128, max_tokens=160, k=(6, 32), repeats=3, update_every=40,
    paper={16: 64, 64: 192},
)  # fmt: skip


def _shown(path: str) -> str:
    """A path as the commands show it: relative to the working directory when under it (``.venv/bin/python``)."""
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path


@dataclass
class Step:
    """One command of the runbook; ``stdout`` captures its output to a file (the simulator's JSON)."""

    name: str
    argv: list[str]
    stdout: Path | None = None

    def shell(self) -> str:
        text = shlex.join(self.argv)
        return text if self.stdout is None else f"{text} > {shlex.quote(str(self.stdout))}"


@dataclass
class Runbook:
    """The commands for one model on one device, and where their outputs go."""

    model: str
    device: str
    quick: bool
    out: Path
    config: Path | None = None
    python: str = field(default_factory=lambda: _shown(sys.executable))
    sizes: Sizes = field(init=False)

    def __post_init__(self) -> None:
        self.sizes = GPU if self.device == "gpu" else (CPU_QUICK if self.quick else CPU_FULL)
        if self.device == "gpu" and self.quick:  # a smoke run on a GPU: the CPU plan's sizes, the GPU's engine
            self.sizes = Sizes(**{**CPU_QUICK.__dict__, "engine": GPU.engine, "replicas": GPU.replicas})

    @property
    def model_id(self) -> str:
        name = Path(self.model).name if Path(self.model).exists() else self.model.rsplit("/", 1)[-1]
        return re.sub(r"[^a-z0-9]+", "-", name.lower().removeprefix("builtin:")).strip("-") or "model"

    @property
    def engine_config(self) -> Path:
        return self.config or self.out / "engine.yaml"

    @property
    def profile(self) -> Path:
        return self.out / "profile.yaml"

    def config_data(self) -> dict[str, Any]:
        """The deployment config every step uses: the model, the engine arguments, the fitted profile."""
        s = self.sizes
        return {
            "model": {"id": self.model_id, "source": self.model},
            "engine": dict(s.engine),
            "scheduler": {"mode": "auto"},
            "replicas": {"num_replicas": 1, **s.replicas, "profile": str(self.profile.resolve())},
            "controller": {"update_every": s.update_every},
            "http": {"host": "127.0.0.1"},
            "ray": {"num_cpus": 2} if self.device == "cpu" else {},
        }

    def write_config(self) -> Path:
        if self.config is None:
            self.out.mkdir(parents=True, exist_ok=True)
            self.engine_config.write_text(
                "# Written by python -m benchmarks.gpu_runbook; edit and pass --config to change it.\n"
                + yaml.safe_dump(self.config_data(), sort_keys=False)
            )
        return self.engine_config

    def steps(self, names: list[str]) -> list[Step]:
        s, py, cfg, out = self.sizes, self.python, str(self.engine_config), self.out
        quick = ["--quick"] if self.quick else []
        plan: list[Step] = []
        for name in names:
            if name == "install":
                plan.append(Step(name, ["bash", "deploy/install.sh"]))
            elif name == "profile":
                argv = [py, "-m", "ebplus.cli", "profile", "--config", cfg, "--name", f"{self.device}-{self.model_id}"]
                plan.append(Step(name, [*argv, "--out", str(self.profile), *quick]))
            elif name == "engine":
                argv = [py, "-m", "benchmarks.engine_bench", "--config", cfg, "--profile", str(self.profile)]
                argv += ["--policies", "mb,eb-fixed,auto", "--k", ",".join(map(str, s.k))]
                argv += ["--requests", str(s.engine_requests), "--concurrency", str(s.engine_concurrency)]
                argv += ["--max-tokens", str(s.max_tokens), "--repeats", str(s.repeats)]
                argv += ["--update-every", str(s.update_every), "--out", str(out / "engine.md")]
                plan.append(Step(name, argv))
            elif name == "compare":
                argv = [py, "-m", "benchmarks.sim_vs_engine", "--engine", str(out / "engine.json")]
                plan.append(Step(name, [*argv, "--profile", str(self.profile), "--out", str(out / "sim-vs-engine.md")]))
            elif name == "paper":
                for c, requests in s.paper.items():
                    argv = [py, "-m", "benchmarks.e2e_bench", "--config", cfg, "--modes", "mb,eb,auto"]
                    argv += ["--dataset", "random", "--input-len", str(s.input_len), "--output-len", str(s.output_len)]
                    argv += ["--range-ratio", "0.5", "--num-prompts", str(requests), "--max-concurrency", str(c)]
                    plan.append(Step(name, [*argv, "--out", str(out / f"paper-c{c}.md")]))
            elif name == "paper-sim":
                plan += self._paper_sim()
            else:
                raise ValueError(f"--steps: unknown step {name!r}; choose from {', '.join(STEPS)}")
        return plan

    def _paper_sim(self) -> list[Step]:
        s = self.sizes
        workload = self.out / "paper-workload.yaml"
        steps = []
        for c, requests in s.paper.items():
            for _, policy in PAPER_MODES:
                argv = [self.python, "-m", "ebplus.cli", "sim", "run", "--profile", str(self.profile)]
                argv += ["--workload", str(workload), "--policy", policy, "--concurrency", str(c)]
                argv += ["--requests", str(requests), "--n", str(s.engine["max_num_seqs"])]
                argv += ["--budget", str(s.engine["max_num_batched_tokens"]), "--json"]
                steps.append(Step("paper-sim", argv, stdout=self.out / f"sim-paper-c{c}-{policy.replace('+', 'plus')}.json"))
        return steps

    def write_paper_workload(self) -> None:
        """The simulator's workload for the real paper runs' lengths (vLLM's random dataset, +-50%)."""
        s = self.sizes
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "paper-workload.yaml").write_text(
            yaml.safe_dump(
                {
                    "name": "paper",
                    "description": f"({s.input_len}, {s.output_len}) uniform +-50%, as vllm bench serve --random-range-ratio 0.5",
                    "input": {"dist": "uniform", "mean": s.input_len, "jitter": 0.5},
                    "output": {"dist": "uniform", "mean": s.output_len, "jitter": 0.5},
                },
                sort_keys=False,
            )
        )


# --------------------------------------------------------------------------- checking and running


def check(step: Step) -> None:
    """Parse a step's arguments with its tool's own parser (raises on any argument the tool does not take)."""
    argv = step.argv
    if argv[0] == "bash":
        if not Path(argv[1]).exists():
            raise ValueError(f"{step.name}: {argv[1]} does not exist")
        return
    module, args = argv[2], argv[3:]
    import importlib

    if module == "ebplus.cli":
        parser = importlib.import_module(module).build_parser(args[0])
    else:
        parser = importlib.import_module(module).build_parser()
    try:
        parser.parse_args(args)
    except SystemExit:  # the tool printed why
        raise ValueError(f"step {step.name}: {module} refuses its arguments (see above)") from None


def run_step(step: Step, cwd: Path) -> None:
    print(f"\n[runbook] {step.name}: {step.shell()}", flush=True)
    if step.stdout is None:
        proc = subprocess.run(step.argv, cwd=cwd)
    else:
        with open(step.stdout, "w") as fh:
            proc = subprocess.run(step.argv, cwd=cwd, stdout=fh)
    if proc.returncode != 0:
        raise SystemExit(f"[runbook] step {step.name} failed with exit code {proc.returncode}: {step.shell()}")


def paper_table(book: Runbook) -> str | None:
    """Measured (e2e) and simulated tokens/s of MB, EB, EB+ per concurrency; ``None`` when neither ran."""
    lines = [
        "| concurrency | MB measured / sim | EB measured / sim | EB+ measured / sim | EB/MB measured / sim |",
        "|---|---|---|---|---|",
    ]
    found = False
    for c in book.sizes.paper:
        real_path = book.out / f"paper-c{c}.json"
        real = {r["mode"]: r["total_tok_per_s"] for r in json.loads(real_path.read_text())} if real_path.exists() else {}
        sim = {}
        for mode, policy in PAPER_MODES:
            path = book.out / f"sim-paper-c{c}-{policy.replace('+', 'plus')}.json"
            if path.exists() and path.stat().st_size:
                sim[mode] = json.loads(path.read_text())["tok_per_s"]
        found = found or bool(real or sim)
        cell = lambda d, m: f"{d[m]:,.0f}" if m in d else "–"  # noqa: E731
        ratio = lambda d: f"{d['eb'] / d['mb']:.3f}" if "eb" in d and "mb" in d else "–"  # noqa: E731
        cells = [f"{cell(real, m)} / {cell(sim, m)}" for m, _ in PAPER_MODES]
        lines.append(f"| {c} | " + " | ".join(cells) + f" | {ratio(real)} / {ratio(sim)} |")
    return "\n".join(lines) if found else None


def report(book: Runbook) -> str:
    parts = [f"# EB+ runbook: {book.model} on {book.device}", ""]
    compare = book.out / "sim-vs-engine.md"
    if compare.exists():
        parts += ["## Simulator vs engine (same request set)", "", compare.read_text(), ""]
    paper = paper_table(book)
    if paper is not None:
        parts += ["## The paper's setting (total tokens/s)", "", paper, ""]
    return "\n".join(parts)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_runbook",
        description=__doc__.split("\n\n")[0],
        epilog="Steps: " + ", ".join(STEPS) + ". See docs/benchmarks/gpu.md.",
    )
    parser.add_argument("--model", default=None, help="Hugging Face id or directory (GPU default Qwen/Qwen2.5-0.5B-Instruct; CPU builtin:tiny)")
    parser.add_argument("--device", choices=("gpu", "cpu"), default="gpu", help="where the engine runs (default gpu)")
    parser.add_argument("--quick", action="store_true", help="small sizes everywhere (a smoke run: minutes)")
    parser.add_argument("--steps", default=DEFAULT_STEPS, help=f"comma-separated (default {DEFAULT_STEPS})")
    parser.add_argument("--config", type=Path, default=None, help="use this deployment config instead of writing one")
    parser.add_argument("--out-dir", type=Path, default=None, help="outputs (default benchmarks/results/runbook-<device>-<model>)")
    parser.add_argument("--dry-run", action="store_true", help="print and check every command, run nothing")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    model = args.model or ("Qwen/Qwen2.5-0.5B-Instruct" if args.device == "gpu" else "builtin:tiny")
    book = Runbook(model, args.device, args.quick, Path("."), args.config)
    book.out = args.out_dir or Path("benchmarks/results") / f"runbook-{args.device}-{book.model_id}"
    names = [n.strip() for n in args.steps.split(",") if n.strip()]
    try:
        steps = book.steps(names)
        book.write_config()
        if "paper-sim" in names:
            book.write_paper_workload()
        from ebplus.profiler.cli import _load_config

        _load_config(book.engine_config, None)  # the config is valid (its profile may not exist yet)
        for step in steps:
            check(step)
    except ValueError as exc:
        parser.error(str(exc))
    print(f"[runbook] {book.model} on {book.device}{' (quick)' if book.quick else ''}; outputs in {book.out}")
    print(f"[runbook] config: {book.engine_config}")
    for step in steps:
        print(f"  {step.shell()}")
    if args.dry_run:
        return 0
    root = Path(__file__).resolve().parents[1]
    for step in steps:
        run_step(step, root if step.name == "install" else Path.cwd())
    text = report(book)
    (book.out / "report.md").write_text(text)
    print("\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
