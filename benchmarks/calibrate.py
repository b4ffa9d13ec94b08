"""Calibrate the shipped hardware profiles against the seed paper's published throughputs.

Why: the authors' per-step calibration (DESIGN §4) does not reproduce their own
end-to-end numbers - on the RTX PRO 6000 the linear model is ~3x too fast, and
their beta_mb(r) came from 1/throughput (it contains fixed costs), which makes
mixing look too expensive on the H200. So each profile keeps the *shape* of the
authors' calibration and fits three factors to part of the published figures,
then is checked on figures held out from the fit.

Model of a GPU (raw = the authors' calibration, phys = datasheet physics):

* fixed costs ``alpha_p, alpha_d, alpha_mb = alpha_p`` scaled by ``s_alpha``;
* per-token costs scaled by ``s_beta``: ``beta_p``, ``beta_d0`` and a KV-read term
  ``beta_kv = kv_bytes_per_token / bandwidth`` per resident KV token in every step
  with decodes. The raw ``beta_d`` was measured at ~``CTX_CAL`` tokens of context,
  so ``beta_d0 = beta_d - beta_kv * CTX_CAL`` keeps the raw decode cost there and
  lets it grow with context (memory bandwidth is the whole story of the paper);
* mixed steps: ``beta_mb(r) = s_beta * (beta_p (1-r) + beta_d0 r + m * e(r))`` where
  ``e(r)`` is the raw curve's excess over additive costs (the interference) and
  ``m`` scales it (``m = 1``: the authors' curve, ``m = 0``: no interference);
* ``kv_capacity_tokens`` from memory: ``(0.9 * memory - weights - 2 GiB) / kv_bytes``
  (vLLM's default ``gpu_memory_utilization`` and Qwen3-8B in bf16).

Fit: ``(s_alpha, s_beta, m)`` per GPU minimise the squared log error of the
simulated MB and online-EB total tokens/s against Table 4 ((512,256) +-50% at
c = 32/512/2048). Held out: Table 5 (distribution and concurrency shift, MB / EB /
EB+) and the sign and size of EB+'s gain over MB on WildChat. L40S and B300 have
no published per-step data: they are derived from the calibrated RTX PRO 6000 and
H200 by datasheet ratios (bandwidth for memory-bound terms, dense bf16 FLOPS for
the prefill per-token cost) and checked only against the WildChat gains.

Run: ``python -m benchmarks.calibrate`` (about 5 minutes on 2 cores); it rewrites
``controller/profiles/*.yaml``, ``docs/benchmarks/results/calibration.md`` and ``benchmarks/results/calibration.json``.
"""

from __future__ import annotations

import argparse
import json
import math
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import minimize

from benchmarks.outputs import SUMMARY_DIR, raw_path
from ebplus.controller.cost_model import PROFILE_DIR, HardwareProfile, dump_profile
from ebplus.simulator.sim import Policy, SimConfig, simulate
from ebplus.simulator.workloads import build_requests, load_source

GIB = 2**30
# Qwen3-8B: 36 layers x 8 KV heads x 128 dims x (K, V) x 2 bytes; 8.19e9 parameters in bf16
KV_BYTES_PER_TOKEN = 36 * 8 * 128 * 2 * 2
WEIGHT_BYTES = 8.19e9 * 2
RESERVE_BYTES = 2 * GIB  # activations, CUDA graphs, non-torch allocations
GPU_MEMORY_UTILIZATION = 0.9
CTX_CAL = 512  # context of the authors' decode calibration (their Fig. 1 used 512-token inputs)

# engine settings of every calibration run (the authors' max_num_seqs; vLLM's default budget)
N_MAX = 2048
BUDGET = 8192


@dataclass(frozen=True)
class Gpu:
    """Datasheet figures (approximate): memory as the driver reports it, bandwidth, dense bf16."""

    memory_gib: float
    bandwidth_tbps: float
    bf16_tflops: float


GPUS = {
    "h200": Gpu(memory_gib=140.4, bandwidth_tbps=4.8, bf16_tflops=989.0),
    "rtx-pro-6000": Gpu(memory_gib=95.6, bandwidth_tbps=1.792, bf16_tflops=500.0),
    "l40s": Gpu(memory_gib=45.0, bandwidth_tbps=0.864, bf16_tflops=362.0),
    "b300": Gpu(memory_gib=268.0, bandwidth_tbps=8.0, bf16_tflops=2250.0),
}

# The authors' calibration, Qwen3-8B (DESIGN §4): alpha_p, beta_p, alpha_d, beta_d, beta_mb (a, b, c).
RAW = {
    "h200": dict(alpha_p=1.2786e-3, beta_p=2.4853e-5, alpha_d=8.921e-3, beta_d=4.586e-5,
                 beta_mb=(2.494e-5, 5.193e-5, 1.478e-5)),
    "rtx-pro-6000": dict(alpha_p=4.691e-3, beta_p=5.008e-5, alpha_d=1.0376e-2, beta_d=1.0388e-4,
                         beta_mb=(6.29e-5, 1.969e-4, 9.9e-6)),
}  # fmt: skip
DERIVED_FROM = {"l40s": "rtx-pro-6000", "b300": "h200"}
TITLES = {"h200": "NVIDIA H200", "rtx-pro-6000": "NVIDIA RTX PRO 6000", "l40s": "NVIDIA L40S", "b300": "NVIDIA B300"}

# Published total tokens/s (seed paper): Table 4, (512,256) at c = 32/512/2048: MB, EB, EB+.
TABLE4 = {
    "h200": {32: (11584, 8609, 11586), 512: (27464, 27207, 27460), 2048: (26368, 27198, 27043)},
    "rtx-pro-6000": {32: (1628, 1277, 1621), 512: (2992, 4422, 4476), 2048: (3242, 4375, 4477)},
}
# Table 5, non-stationary: MB, EB, EB+.
TABLE5 = {
    "h200": {"distribution-shift": (18307, 17394, 20776), "concurrency-shift": (24251, 23374, 24397)},
    "rtx-pro-6000": {"distribution-shift": (3456, 4467, 4752), "concurrency-shift": (3019, 3306, 3451)},
}
# EB+ over MB on WildChat (Qwen3-8B).
WILDCHAT_GAIN = {"l40s": 0.423, "rtx-pro-6000": 0.118, "h200": 0.022, "b300": 0.0}
TABLE4_REQUESTS = {32: 500, 512: 2500, 2048: 6000}
WILDCHAT_CONCURRENCY = 512
WILDCHAT_REQUESTS = 3000


@dataclass(frozen=True)
class Factors:
    """The fitted factors of one GPU (see the module docstring)."""

    s_alpha: float = 1.0
    s_beta: float = 1.0
    m: float = 1.0
    kv_term: bool = True


RAW_FACTORS = Factors(kv_term=False)  # the authors' calibration as published


def kv_capacity_tokens(gpu: Gpu) -> int:
    free = GPU_MEMORY_UTILIZATION * gpu.memory_gib * GIB - WEIGHT_BYTES - RESERVE_BYTES
    return int(free // KV_BYTES_PER_TOKEN)


def beta_kv_phys(gpu: Gpu) -> float:
    return KV_BYTES_PER_TOKEN / (gpu.bandwidth_tbps * 1e12)


def build(name: str, f: Factors, description: str = "") -> HardwareProfile:
    """The profile of GPU ``name`` under factors ``f`` (derived GPUs scale their source's raw terms)."""
    gpu = GPUS[name]
    source = DERIVED_FROM.get(name, name)
    raw = RAW[source]
    bw = GPUS[source].bandwidth_tbps / gpu.bandwidth_tbps  # memory-bound terms scale with 1/bandwidth
    fl = GPUS[source].bf16_tflops / gpu.bf16_tflops  # compute-bound terms with 1/FLOPS
    a, b, c = raw["beta_mb"]
    beta_p, beta_d = raw["beta_p"], raw["beta_d"]
    excess = (a - beta_p, b - (beta_d - beta_p), c)  # e(r) = raw beta_mb(r) - additive cost
    beta_kv = beta_kv_phys(GPUS[source]) if f.kv_term else 0.0
    beta_d0 = beta_d - beta_kv * CTX_CAL
    bp, bd0 = beta_p * fl, beta_d0 * bw
    e = tuple(x * bw * f.m for x in excess)
    return HardwareProfile(
        name=name,
        description=description,
        alpha_p=f.s_alpha * raw["alpha_p"] * bw,
        beta_p=f.s_beta * bp,
        alpha_d=f.s_alpha * raw["alpha_d"] * bw,
        beta_d=f.s_beta * bd0,
        beta_mb=(f.s_beta * (bp + e[0]), f.s_beta * (bd0 - bp + e[1]), f.s_beta * e[2]),
        alpha_mb=f.s_alpha * raw["alpha_p"] * bw,
        beta_kv=f.s_beta * beta_kv * bw,
        kv_capacity_tokens=kv_capacity_tokens(gpu),
    )


# ---------------------------------------------------------------------------
# simulated counterparts of the published numbers


def run_case(profile: HardwareProfile, workload: str, policy: Policy, concurrency: int | None, requests: int | None):
    reqs = build_requests(load_source(workload), seed=0, requests=requests, concurrency=concurrency)
    return simulate(profile, reqs, SimConfig(policy=policy, n=N_MAX, budget=BUDGET)).tok_per_s


def table4_sim(profile: HardwareProfile) -> dict[int, tuple[float, float]]:
    return {
        c: tuple(run_case(profile, "paper", p, c, TABLE4_REQUESTS[c]) for p in (Policy.MB, Policy.EB))
        for c in TABLE4_REQUESTS
    }


def table5_sim(profile: HardwareProfile) -> dict[str, tuple[float, float, float]]:
    return {
        sched: tuple(run_case(profile, sched, p, None, None) for p in (Policy.MB, Policy.EB, Policy.EBPLUS))
        for sched in ("distribution-shift", "concurrency-shift")
    }


def wildchat_gain_sim(profile: HardwareProfile) -> float:
    mb, ebp = (
        run_case(profile, "wildchat-like", p, WILDCHAT_CONCURRENCY, WILDCHAT_REQUESTS)
        for p in (Policy.MB, Policy.EBPLUS)
    )
    return ebp / mb - 1.0


def _log_errors(name: str, sim: dict) -> list[float]:
    return [math.log(s / p) for c, pub in TABLE4[name].items() for s, p in zip(sim[c], pub[:2], strict=True)]


def fit(name: str, max_evals: int = 90) -> tuple[Factors, float]:
    """Nelder-Mead over (log s_alpha, log s_beta, m) on Table 4; returns the factors and RMS log error."""

    def objective(x: np.ndarray) -> float:
        f = Factors(s_alpha=math.exp(x[0]), s_beta=math.exp(x[1]), m=min(max(x[2], 0.0), 3.0))
        errs = _log_errors(name, table4_sim(build(name, f)))
        return float(np.mean(np.square(errs)))

    # a start at the overall level mismatch: the raw model's mean error on Table 4
    level = -float(np.mean(_log_errors(name, table4_sim(build(name, Factors())))))
    start = np.array([level, level, 0.5])
    res = minimize(
        objective,
        start,
        method="Nelder-Mead",
        options={"maxfev": max_evals, "xatol": 0.01, "fatol": 1e-5, "initial_simplex": start + _SIMPLEX},
    )
    x = res.x
    return Factors(s_alpha=math.exp(x[0]), s_beta=math.exp(x[1]), m=min(max(x[2], 0.0), 3.0)), math.sqrt(res.fun)


_SIMPLEX = np.array([[0.0, 0.0, 0.0], [0.4, 0.0, 0.0], [0.0, 0.4, 0.0], [0.0, 0.0, 0.5]])


# ---------------------------------------------------------------------------
# report


def _rel(sim: float, pub: float) -> str:
    return f"{sim:,.0f} ({100 * (sim / pub - 1):+.0f}%)"


def evaluate(name: str, f: Factors) -> dict:
    """Every published number for GPU ``name`` next to its simulated value under factors ``f``."""
    prof = build(name, f)
    out: dict = {"wildchat_gain": wildchat_gain_sim(prof)}
    if name in TABLE4:
        out["table4"] = table4_sim(prof)
        out["table5"] = table5_sim(prof)
    return out


def _rms(xs: list[float]) -> float:
    return math.sqrt(sum(x * x for x in xs) / len(xs)) if xs else float("nan")


def summarise(name: str, ev: dict) -> dict:
    """RMS log errors of the fit set (Table 4 MB/EB) and of the held-out Table 5 (MB/EB/EB+)."""
    res = {"wildchat_gain_sim": ev["wildchat_gain"], "wildchat_gain_paper": WILDCHAT_GAIN[name]}
    if "table4" in ev:
        res["fit_rms_log_error"] = _rms(_log_errors(name, ev["table4"]))
        held = [math.log(s / p) for k, pub in TABLE5[name].items() for s, p in zip(ev["table5"][k], pub, strict=True)]
        res["holdout_rms_log_error"] = _rms(held)
    return res


def describe(name: str, f: Factors, summary: dict) -> str:
    gpu = GPUS[name]
    lines = [f"{TITLES[name]} serving Qwen3-8B (bf16), calibrated by benchmarks/calibrate.py."]
    if name in RAW:
        raw = RAW[name]
        lines.append(
            "Raw paper calibration (DESIGN 4): "
            + ", ".join(f"{k}={v}" for k, v in raw.items() if k != "beta_mb")
            + f", beta_mb={list(raw['beta_mb'])}."
        )
        lines.append(
            f"Fitted to Table 4 (MB and EB, c=32/512/2048): s_alpha={f.s_alpha:.3f}, s_beta={f.s_beta:.3f}, "
            f"interference m={f.m:.3f}; RMS error {100 * summary['fit_rms_log_error']:.0f}% on the fit set, "
            f"{100 * summary['holdout_rms_log_error']:.0f}% on held-out Table 5."
        )
    else:
        src = DERIVED_FROM[name]
        lines.append(
            f"Derived from the calibrated {TITLES[src]} profile (same factors s_alpha={f.s_alpha:.3f}, "
            f"s_beta={f.s_beta:.3f}, m={f.m:.3f}) by datasheet ratios: memory-bound terms (alphas, beta_d, "
            f"beta_kv, interference) x {GPUS[src].bandwidth_tbps}/{gpu.bandwidth_tbps} TB/s, beta_p x "
            f"{GPUS[src].bf16_tflops:g}/{gpu.bf16_tflops:g} dense bf16 TFLOPS. No per-step data was published: "
            f"check it against your GPU with `ebplus profile`."
        )
    lines.append(
        f"KV read per resident token {KV_BYTES_PER_TOKEN} B at {gpu.bandwidth_tbps} TB/s; KV capacity = "
        f"({GPU_MEMORY_UTILIZATION} x {gpu.memory_gib} GiB - weights - 2 GiB) / {KV_BYTES_PER_TOKEN} B. "
        f"WildChat EB+ gain over MB: paper {100 * summary['wildchat_gain_paper']:+.1f}%, this profile "
        f"{100 * summary['wildchat_gain_sim']:+.1f}% (wildchat-like workload, c={WILDCHAT_CONCURRENCY})."
    )
    return " ".join(lines)


def write_report(results: dict, path_md: Path) -> None:
    rows = [
        "# Profile calibration",
        "",
        "Generated by `python -m benchmarks.calibrate`; see its docstring for the model.",
        "",
    ]
    rows += [
        "| profile | s_alpha | s_beta | m | fit RMS (Table 4) | hold-out RMS (Table 5) | raw fit RMS | raw hold-out RMS |"
    ]
    rows += ["|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        f = r["factors"]
        s, raw = r["summary"], r.get("raw_summary", {})
        pct = lambda x: "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.0f}%"  # noqa: E731
        rows.append(
            f"| {name} | {f['s_alpha']:.3f} | {f['s_beta']:.3f} | {f['m']:.3f} | {pct(s.get('fit_rms_log_error'))} "
            f"| {pct(s.get('holdout_rms_log_error'))} | {pct(raw.get('fit_rms_log_error'))} "
            f"| {pct(raw.get('holdout_rms_log_error'))} |"
        )
    rows += ["", "Published vs simulated total tokens/s (relative error); EB is the online EB(k̂*).", ""]
    rows += ["| profile | figure | setting | MB | EB | EB+ |", "|---|---|---|---|---|---|"]
    for name, r in results.items():
        ev = r["evaluation"]
        if "table4" not in ev:
            continue
        for c, pub in TABLE4[name].items():
            mb, eb = ev["table4"][c]
            rows.append(f"| {name} | Table 4 (fit) | c={c} | {_rel(mb, pub[0])} | {_rel(eb, pub[1])} | - |")
        for k, pub in TABLE5[name].items():
            cells = " | ".join(_rel(s, p) for s, p in zip(ev["table5"][k], pub, strict=True))
            rows.append(f"| {name} | Table 5 (hold-out) | {k} | {cells} |")
    rows += ["", "EB+ gain over MB on WildChat (hold-out; the simulated workload is a lognormal stand-in):", ""]
    rows += ["| profile | paper | calibrated | raw |", "|---|---|---|---|"]
    for name, r in results.items():
        raw = r.get("raw_summary", {}).get("wildchat_gain_sim")
        rows.append(
            f"| {name} | {100 * WILDCHAT_GAIN[name]:+.1f}% | {100 * r['summary']['wildchat_gain_sim']:+.1f}% | "
            + ("-" if raw is None else f"{100 * raw:+.1f}%")
            + " |"
        )
    path_md.write_text("\n".join(rows) + "\n")


def _fit_job(name: str) -> tuple[str, Factors, float]:
    f, rms = fit(name)
    return name, f, rms


def _eval_job(args: tuple[str, Factors]) -> tuple[str, Factors, dict]:
    name, f = args
    return name, f, evaluate(name, f)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.calibrate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--profiles-dir", type=Path, default=PROFILE_DIR)
    parser.add_argument("--report", type=Path, default=SUMMARY_DIR / "calibration.md")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    with ProcessPoolExecutor(args.workers) as pool:
        fitted = {name: f for name, f, _ in pool.map(_fit_job, list(RAW))}
        factors = {name: fitted.get(name) or fitted[DERIVED_FROM[name]] for name in GPUS}
        jobs = [(name, factors[name]) for name in GPUS] + [(name, RAW_FACTORS) for name in RAW]
        evaluated = list(pool.map(_eval_job, jobs))
    results: dict = {}
    for name, f, ev in evaluated:
        entry = results.setdefault(name, {})
        key = "raw" if f == RAW_FACTORS else "cal"
        if key == "raw":
            entry["raw_summary"] = summarise(name, ev)
            entry["raw_evaluation"] = ev
        else:
            entry["factors"] = asdict(f)
            entry["evaluation"] = ev
            entry["summary"] = summarise(name, ev)
    for name, r in results.items():
        prof = build(name, Factors(**r["factors"]), describe(name, Factors(**r["factors"]), r["summary"]))
        dump_profile(prof, args.profiles_dir / f"{name}.yaml")
    args.report.parent.mkdir(parents=True, exist_ok=True)
    write_report(results, args.report)
    raw_path(args.report).write_text(json.dumps(results, indent=1, default=str))
    print(args.report.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
