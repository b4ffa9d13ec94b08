"""What a probe run's points say: the fitted profile, the interference threshold r*, the plot, the simulator.

Reads ``DIR/points.csv`` and ``DIR/run.yaml`` (:mod:`benchmarks.gpu_probe`) and writes

* ``DIR/profile.yaml``: the points' every timed step through the controller's own cost fit,
  the one ``ebplus profile`` uses on a real engine (the fastest repeat of each step shape, Huber
  fits per step kind, ``beta_mb(r)`` and the KV-read term ``beta_kv``; the decode sweep's two
  axes, batch and context, are what lets the fit separate ``beta_d`` from ``beta_kv``), in the
  project's profile format (``ebplus sim run --profile DIR/profile.yaml``);
* ``DIR/interference.png``: step time against the decode share ``r`` like the paper's Figure 1,
  measured (the fastest repeat of each point, a bar up to the median) and as the fitted model prices it;
* ``DIR/report.md`` (where the fit ran): the fit, r* from the measured curve beside the paper's, and with
  ``simulate`` the simulator's MB / EB / EB+ on the paper workload on this profile beside the
  paper-calibrated H200 one.

r* is read two ways from the measured curve (the fastest repeat of each point, as the fit reads
them) at Figure 1's batch (:func:`interference`): the
*knee*, the break of the best continuous two-segment line through ``T(r)`` (the paper's "roughly
constant below r*, rising sharply above"), and the first ``r`` where a step costs 10% more than
the prefill-only step of the same tokens.

The fit and the simulator need the installed project; the plot needs matplotlib. Without them
(the GPU machine) the report says what it skipped and how to make it later.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml

#: The paper's reading of Figure 1 (Llama-3.1-8B, batch 1024, 512-token inputs): interference
#: sets in above r = 0.8 on the H200 and above r = 0.2 on the RTX PRO 6000.
PAPER_R_STAR = {"H200": 0.8, "RTX PRO 6000": 0.2}
#: A step at share r counts as interfered with when it costs this much more than at r = 0.
THRESHOLD = 0.10
#: A knee counts when the curve's slope at least doubles there.
BEND = 2.0
#: The simulator table: the paper's Table 4 runs (concurrency: requests), the policies, N.
SIM_RUNS = {32: 500, 512: 2500, 2048: 6000}
SIM_POLICIES = ("mb", "eb", "eb+")
SIM_N = 2048
BASELINE_PROFILE = "h200"


def read_points(path: Path) -> list[dict]:
    """``points.csv`` rows with numbers as numbers and ``samples_s`` as a list."""
    rows = []
    with path.open() as f:
        for row in csv.DictReader(f):
            out: dict = {}
            for k, v in row.items():
                if k in ("sweep", "kind"):
                    out[k] = v
                elif k == "samples_s":
                    out[k] = [float(x) for x in v.split()]
                else:
                    out[k] = float(v) if any(c in v for c in ".e") else int(v)
            rows.append(out)
    return rows


# --------------------------------------------------------------------------- r*


def knee(r: np.ndarray, t: np.ndarray) -> tuple[float, float, float] | None:
    """``(break, slope below, slope above)`` of the least-squares continuous two-segment line
    ``t = a + b r + c max(0, r - break)``, the break searched between the second and the
    second-to-last ``r``; ``None`` with fewer than 4 points."""
    order = np.argsort(r)
    r, t = np.asarray(r, float)[order], np.asarray(t, float)[order]
    if len(r) < 4:
        return None
    best = None
    for b in np.linspace(r[1], r[-2], 241):
        design = np.column_stack([np.ones_like(r), r, np.maximum(0.0, r - b)])
        coef, *_ = np.linalg.lstsq(design, t, rcond=None)
        sse = float(np.sum((design @ coef - t) ** 2))
        if best is None or sse < best[0]:
            best = (sse, float(b), coef)
    _, b, coef = best
    return b, float(coef[1]), float(coef[1] + coef[2])


def threshold_share(r: np.ndarray, t: np.ndarray, tol: float = THRESHOLD) -> float | None:
    """The first ``r`` (linear between points) where ``t`` exceeds ``(1 + tol)`` times ``t`` at the
    smallest ``r``; ``None`` if it never does."""
    order = np.argsort(r)
    r, t = np.asarray(r, float)[order], np.asarray(t, float)[order]
    limit = (1.0 + tol) * t[0]
    for i in range(1, len(r)):
        if t[i] > limit:
            return float(r[i - 1] + (limit - t[i - 1]) / (t[i] - t[i - 1]) * (r[i] - r[i - 1]))
    return None


def interference(r: np.ndarray, t: np.ndarray) -> dict:
    """r* of one curve: the knee, where the curve bends sharply upward (the slope above at least
    :data:`BEND` times the slope below, or any rise after a flat or falling part), and the 10% threshold.
    A curve without such a bend (a straight rise, a convex curve that only steepens gently) has no knee."""
    k = knee(r, t)
    bends = k is not None and k[2] > 0 and k[2] >= BEND * max(k[1], 0.0)
    return {
        "r_star_knee": round(k[0], 3) if bends else None,
        "slope_below_s": k[1] if k else None,
        "slope_above_s": k[2] if k else None,
        "r_star_10pct": _round(threshold_share(r, t)),
    }


def _round(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def model_curve(profile, tokens: int, context: int, shares) -> np.ndarray:
    """Step seconds the profile's cost model gives a step of ``tokens`` at each decode share
    (decodes at ``context``): prefill-only at r = 0, decode-only at r = 1, mixed between."""
    out = []
    for r in shares:
        d = round(r * tokens)
        out.append(profile.step_seconds(tokens - d, d, d * context))
    return np.asarray(out)


def mixed_curves(rows: list[dict]) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Per mixed n_tok: ``(r, median, min, max)`` of the mixed sweep, by r."""
    curves = {}
    for n in sorted({row["tokens"] for row in rows if row["sweep"] == "mixed"}):
        pts = sorted((row for row in rows if row["sweep"] == "mixed" and row["tokens"] == n), key=lambda x: x["r"])
        curves[n] = tuple(np.asarray([p[k] for p in pts], float) for k in ("r", "median_s", "min_s", "max_s"))
    return curves


# --------------------------------------------------------------------------- the fit


def fit(rows: list[dict], run: dict, name: str):
    """The profile the controller's fitter makes of every timed step, and its median errors per kind."""
    # the project's profiler (ebplus.profiler on main): the fit `ebplus profile` runs on a real engine
    from ebplus.controller.cost_model import HardwareProfile
    from ebplus.controller.messages import StepRecord
    from ebplus.profiler.profiling import fit_profile, residuals

    steps = [
        StepRecord(row["prefill_tokens"], row["decode_tokens"], row["prompts"] + row["batch"], 0, s, row["kv_tokens"])
        for row in rows
        for s in row["samples_s"]
    ]
    result = fit_profile(steps)
    errors = residuals(result.model, steps)
    shape, plan = run["model"], run["plan"]
    description = (
        f"Fitted by benchmarks/gpu_probe.py on {run['device']}, {run['date']}: {shape['name']} layer shape "
        f"({plan['probe_layers']} of {shape['layers']} layers run, times scaled to all), random {plan['dtype']} "
        f"weights, PyTorch {run['torch']} eager (no CUDA graphs), SDPA ({run['sdpa_backends']}), paged KV cache "
        f"(block size {plan['block_size']}). Not vLLM's kernels, scheduler or sampler. {result.n_prefill_steps} "
        f"prefill-only, {result.n_decode_steps} decode-only and {result.n_mixed_steps} mixed step shapes (fastest "
        f"of {len(steps)} timed steps), the controller's Huber fits (fit_profile); median relative error per kind: "
        + ", ".join(f"{k} {v:.1%}" for k, v in errors.items())
        + ". KV capacity = (0.9 x memory - full-model weights - 2 GiB) / KV bytes per token."
    )
    profile = HardwareProfile(
        **result.model.model_dump(), name=name, kv_capacity_tokens=run["kv_capacity_tokens"], description=description
    )
    return profile, result, errors


# --------------------------------------------------------------------------- the simulator


def simulate(profile: str) -> dict[tuple[int, str], float]:
    """Total tokens/s of ``ebplus sim run`` on the paper workload for each (concurrency, policy)."""
    out = {}
    for c, requests in SIM_RUNS.items():
        for policy in SIM_POLICIES:
            cmd = [sys.executable, "-m", "ebplus.cli", "sim", "run", "--profile", profile, "--workload", "paper",
                   "--policy", policy, "--concurrency", str(c), "--n", str(SIM_N), "--requests", str(requests),
                   "--json"]  # fmt: skip
            done = subprocess.run(cmd, check=True, capture_output=True, text=True)
            out[c, policy] = float(json.loads(done.stdout)["tok_per_s"])
    return out


def simulator_table(probe: Path, probe_name: str) -> list[str]:
    # the paper's published Table 4 (the calibration's targets; benchmarks.calibrate on main)
    from benchmarks.calibrate import TABLE4

    lines = [
        "| profile | c | MB | EB | EB+ | EB / MB | EB+ / max(MB, EB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, source in ((probe_name, str(probe)), (BASELINE_PROFILE, BASELINE_PROFILE)):
        tp = simulate(source)
        for c in SIM_RUNS:
            mb, eb, ebp = (tp[c, p] for p in SIM_POLICIES)
            lines.append(
                f"| `{label}` | {c} | {mb:,.0f} | {eb:,.0f} | {ebp:,.0f} | {eb / mb:.2f} | {ebp / max(mb, eb):.3f} |"
            )
    for c in SIM_RUNS:
        mb, eb, ebp = TABLE4["h200"][c]
        lines.append(
            f"| paper, H200 measured | {c} | {mb:,} | {eb:,} | {ebp:,} | {eb / mb:.2f} | {ebp / max(mb, eb):.3f} |"
        )
    return lines


# --------------------------------------------------------------------------- plot and report


def plot(path: Path, rows: list[dict], run: dict, profile, r_star: float | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plan = run["plan"]
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    for i, (n, (r, med, lo, _)) in enumerate(mixed_curves(rows).items()):
        color = f"C{i}"
        width = 2.0 if n == plan["figure_tokens"] else 1.2
        ax.errorbar(r, lo * 1e3, yerr=[np.zeros_like(lo), (med - lo) * 1e3], color=color, marker="o", ms=4,
                    lw=width, capsize=2, label=f"n_tok = {n}, measured (fastest repeat, bar to the median)")  # fmt: skip
        if profile is not None:
            grid = np.linspace(0.01, 0.99, 99)
            ax.plot(grid, model_curve(profile, n, plan["mixed_context"], grid) * 1e3, color=color, ls="--", lw=1,
                    label=f"n_tok = {n}, fitted model (fit to the fastest repeats)")  # fmt: skip
    if r_star is not None:
        ax.axvline(
            r_star, color="k", ls=":", lw=1, label=f"r* = {r_star:.2f} (knee at n_tok = {plan['figure_tokens']})"
        )
    shape = run["model"]
    ax.set_title(f"Step time against decode share: {shape['name']} on {run['device']}", fontsize=10)
    ax.set_xlabel("decode share r = n_decode / n_tok")
    ax.set_ylabel(f"step time at {shape['layers']} layers (ms)")
    ax.set_xlim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plain(x):
    return list(x) if isinstance(x, tuple) else x


def _fmt(x) -> str:
    return "—" if x is None else f"{x:.3g}" if isinstance(x, float) else str(x)


def make(out: Path, simulate: bool = False, name: str | None = None, command: str | None = None) -> dict:
    """Fit, read r*, plot and write ``report.md`` in ``out``; returns what it found (also printed)."""
    out = Path(out)
    rows = read_points(out / "points.csv")
    run = yaml.safe_load((out / "run.yaml").read_text())
    plan, shape = run["plan"], run["model"]
    device = run["device"]
    slug = "cpu" if device.startswith("cpu") else device.lower().replace("nvidia", "").strip().replace(" ", "-")
    name = name or f"gpu-probe-{slug}-{shape['name']}"
    curves = mixed_curves(rows)
    found: dict = {"points": len(rows), "timed_steps": sum(len(r["samples_s"]) for r in rows)}
    # r* from the fastest repeat of each point, as the fit reads them: other processes only add time
    found["r_star"] = {n: interference(r, fastest) for n, (r, _, fastest, _) in curves.items()}
    figure = found["r_star"].get(plan["figure_tokens"], {})
    notes, profile = [], None
    try:
        from ebplus.controller.cost_model import dump_profile, resolve_profile
    except ImportError:
        notes.append("the project is not installed here: no profile.yaml (run `--report DIR` where it is)")
    else:
        profile, _, errors = fit(rows, run, name)
        dump_profile(profile, out / "profile.yaml")
        found["profile"] = {k: _plain(getattr(profile, k)) for k in ("alpha_p", "beta_p", "alpha_d", "beta_d", "beta_mb",
                                                             "alpha_mb", "beta_kv", "kv_capacity_tokens")}  # fmt: skip
        found["fit_errors"] = errors
        grid = np.asarray(plan["mixed_shares"], float)
        n_fig, ctx = plan["figure_tokens"], plan["mixed_context"]
        found["r_star_fitted"] = interference(grid, model_curve(profile, n_fig, ctx, grid))
        # the shipped H200 profile priced at the paper's setting (1024 tokens, 512 context) by the same rule
        found["r_star_h200_profile"] = interference(grid, model_curve(resolve_profile("h200"), 1024, 512, grid))
    try:
        plot(out / "interference.png", rows, run, profile, figure.get("r_star_knee"))
    except ImportError:
        notes.append("matplotlib is not installed here: no interference.png")
    table = simulator_table(out / "profile.yaml", name) if simulate and profile is not None else None
    if profile is not None:  # else the r* above is all there is, and it is printed (the GPU machine's 8 files back)
        (out / "report.md").write_text(render(run, rows, found, table, notes, name, command))
    print(yaml.safe_dump({"r_star": found["r_star"], **{k: v for k, v in found.items() if k != "r_star"}},
                         sort_keys=False, default_flow_style=None).strip())  # fmt: skip
    for note in notes:
        print(f"note: {note}")
    if table:
        print("\n".join(table))
    return found


def render(run: dict, rows: list[dict], found: dict, table, notes: list[str], name: str, command: str | None) -> str:
    plan, shape = run["plan"], run["model"]
    counts = {s: sum(r["sweep"] == s for r in rows) for s in ("prefill", "decode", "mixed")}
    backends = ", ".join(f"{k} {v}" for k, v in run["sdpa_backends"].items())
    load = run.get("load_average_1min", {})
    lines = [
        f"# Step-cost probe: {shape['name']} on {run['device']}",
        "",
        f"Measured by `{run.get('command', 'python -m benchmarks.gpu_probe')}` on {run['date']} (PyTorch "
        f"{run['torch']}, {plan['probe_layers']} of {shape['layers']} layers run and scaled, {plan['dtype']}, SDPA "
        f"backends: {backends}; timer: {run.get('timer', '—')}; 1-minute load average {load.get('before', '—')} before, {load.get('after', '—')} "
        f"after). {len(rows)} points ({counts['prefill']} prefill, {counts['decode']} decode, {counts['mixed']} "
        f"mixed), {plan['warmup']} warm-up and {plan['repeats']} timed steps each, measured in "
        f"{run['elapsed_s']:.1f} s (plan estimate {run.get('plan_summary', {}).get('estimated_s', '—')} s); "
        f"{len(run['points_skipped'])} points skipped at the time budget, {len(run.get('points_failed', []))} failed."
        + (f" This report: `{command}`." if command and command != run.get("command") else ""),
        "",
        "Files: `points.csv` (every point, seconds at full depth, every repeat), `run.yaml` (device, shape, plan), "
        "`profile.yaml` (the fitted profile), `interference.png`.",
        "",
        "![Step time against the decode share r](interference.png)",
        "",
        "## Interference threshold r*",
        "",
        "| curve | r* (knee) | slope below (ms per unit r) | slope above | r* (10% over r = 0) |",
        "|---|---|---|---|---|",
    ]

    def row(label: str, d: dict) -> str:
        ms = [None if d.get(k) is None else d[k] * 1e3 for k in ("slope_below_s", "slope_above_s")]
        return f"| {label} | {_fmt(d.get('r_star_knee'))} | {_fmt(ms[0])} | {_fmt(ms[1])} | {_fmt(d.get('r_star_10pct'))} |"

    for n, d in found["r_star"].items():
        figure = (
            ""
            if n != plan["figure_tokens"]
            else " (Figure 1's batch)"
            if n == 1024
            else (" (this plan's Figure 1 curve; the paper's batch is 1024)")
        )
        lines.append(row(f"measured, n_tok = {n}{figure}", d))
    if "r_star_fitted" in found:
        lines.append(row(f"fitted model, n_tok = {plan['figure_tokens']}", found["r_star_fitted"]))
        lines.append(
            row("shipped `h200` profile (paper-calibrated), n_tok = 1024, context 512", found["r_star_h200_profile"])
        )
    lines.append("| paper, Figure 1, H200 (RTX PRO 6000) | ~0.8 (~0.2) | | | |")
    if "profile" in found:
        p = found["profile"]
        lines += [
            "",
            f"## Fitted profile `{name}`",
            "",
            "| α_p (s) | β_p (s/token) | α_d (s) | β_d (s/seq) | β_kv (s/KV token) | α_mb (s) | β_mb(r) = a + b r + c r² | KV capacity |",
            "|---|---|---|---|---|---|---|---|",
            f"| {p['alpha_p']:.4g} | {p['beta_p']:.4g} | {p['alpha_d']:.4g} | {p['beta_d']:.4g} | {p['beta_kv']:.4g} | "
            f"{p['alpha_mb']:.4g} | {', '.join(f'{x:.4g}' for x in p['beta_mb'])} | {p['kv_capacity_tokens']:,} |",
            "",
            "Median relative error of the fit per step kind: "
            + ", ".join(f"{k} {v:.1%}" for k, v in found["fit_errors"].items())
            + ".",
        ]
    if table:
        lines += [
            "",
            "## The simulator on this profile",
            "",
            f"`ebplus sim run --workload paper --n {SIM_N} --policy mb|eb|eb+ --concurrency C --requests R --json`, "
            f"total tokens/s, c = 32, 512, 2048 with R = {', '.join(f'{r:,}' for r in SIM_RUNS.values())} (the "
            "paper's Table 4 runs), on this profile and on the shipped `h200` profile (Qwen3-8B, calibrated to the "
            "paper's Table 4, whose measured figures are the last rows).",
            "",
            *table,
        ]
    if notes:
        lines += ["", *[f"Note: {n}." for n in notes]]
    return "\n".join(lines) + "\n"
