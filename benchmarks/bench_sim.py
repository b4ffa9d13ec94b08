"""``ebplus bench sim``: every shipped profile x setting x policy, as tables, JSON and plots.

Settings (DESIGN §4, the paper's experiments):

* synthetic saturated workloads - decode-heavy (128,1024), balanced (512,512),
  prefill-heavy (1024,128), +-50% uniform - measured in steady state (the 20-80%
  completion window: a finite backlog's warm-up and drain are not the regime the
  closed forms describe, and the drain penalises every EB(k > 1) alike);
* the paper's (512,256) traffic at c = 32, 512 and 2048 and the two
  non-stationary schedules, measured over the whole run as ``vllm bench serve``
  does;
* capped traffic (issue 12), saturated and in steady state: every request cut
  at one cap (``--ignore-eos``), caps uniform +-50%, and natural stops mixed with
  caps;
* open loop (:mod:`benchmarks.bench_open`): Poisson and bursty arrivals at
  50/80/95% of MB's capacity, scored by goodput under latency targets pinned to
  what MB achieves there.

Policies: ``mb``; ``v0``; ``eb`` with the best fixed k (a sweep over k at the online
run's final N and at ``max_num_seqs``, powers of two refined by sqrt(2) steps);
online ``eb`` (the controller sets k and N); ``eb+``. Every policy of a setting
sees the same requests. Each value is the mean over ``--seeds`` request seeds, and
the best fixed k is picked on as many *other* seeds (the tuning seeds), then
measured on the reported ones: a drained run ends on whole cohorts, so one seed's
total throughput swings by up to 2% with the seed (B300 distribution shift, EB
k = 8: 44.5k or 42.8k tok/s), and a sweep that keeps the best of a dozen such
draws and reports it on the same draws credits the fixed k with that luck.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from benchmarks import cold_start, model_check
from benchmarks.outputs import raw_path
from benchmarks.pinned import sim_profile
from ebplus.controller import theory
from ebplus.controller.config import ControllerConfig, PlannerConfig, SloConfig
from ebplus.controller.cost_model import profile_names
from ebplus.simulator.latency import SloTargets
from ebplus.simulator.sim import Policy, SimConfig, SimResult, simulate
from ebplus.simulator.workloads import build_requests, load_source

BUDGET = 8192
# Published EB/MB total-throughput ratios, Table 4 ((512,256), c = 32/512/2048).
PAPER_EB_OVER_MB = {
    "h200": {32: 8609 / 11584, 512: 27207 / 27464, 2048: 27198 / 26368},
    "rtx-pro-6000": {32: 1277 / 1628, 512: 4422 / 2992, 2048: 4375 / 3242},
}


@dataclass(frozen=True)
class Setting:
    """One benchmark setting: a workload or schedule, its arrivals and engine limit, how it is measured."""

    key: str
    workload: str
    concurrency: int | None
    requests: int | None  # None: the schedule's own counts
    n: int  # max_num_seqs
    metric: str  # "steady" (saturated), "run" (whole run) or "goodput" (open loop, under Task.slo)
    kind: str  # "synthetic", "paper", "shift", "capped" or "open"
    rate: float | None = None  # open loop: requests/s
    burst_cv: float | None = None  # open loop: Gamma arrivals with this CV (None: Poisson)


SETTINGS = (
    Setting("decode-heavy", "decode-heavy", None, 6000, 1024, "steady", "synthetic"),
    Setting("balanced", "balanced", None, 6000, 1024, "steady", "synthetic"),
    Setting("prefill-heavy", "prefill-heavy", None, 8000, 1024, "steady", "synthetic"),
    Setting("paper c=32", "paper", 32, 1000, 2048, "run", "paper"),
    Setting("paper c=512", "paper", 512, 4000, 2048, "run", "paper"),
    Setting("paper c=2048", "paper", 2048, 8000, 2048, "run", "paper"),
    Setting("distribution-shift", "distribution-shift", None, None, 2048, "run", "shift"),
    Setting("concurrency-shift", "concurrency-shift", None, None, 2048, "run", "shift"),
    Setting("capped-all", "capped-all", None, 6000, 1024, "steady", "capped"),
    Setting("capped-uniform", "capped-uniform", None, 6000, 1024, "steady", "capped"),
    Setting("capped-mix", "capped-mix", None, 6000, 1024, "steady", "capped"),
)
POLICY_COLUMNS = ("mb", "v0", "eb-best", "eb-online", "eb+")


@dataclass(frozen=True)
class Task:
    profile: str
    setting: Setting
    policy: Policy
    k: int | None
    n: int
    seeds: tuple[int, ...]
    scale: float
    series: bool = False  # keep the k/mode timeline and a throughput series (plots)
    slo: SloTargets | None = None  # latency targets (goodput settings)


#: Per-seed figures averaged into a task's ``latency`` (besides the setting's ``value``).
LATENCY_KEYS = ("tok_per_s", "goodput_req_per_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "stall_p99_s")
#: Completions after which a run counts its mode switches (``switches_after_warmup``): the
#: controller's first decisions are its cold start, not oscillation.
WARMUP_COMPLETIONS = 1000


def _series(res: SimResult, bins: int = 120) -> dict:
    """Completed tokens per second in ``bins`` windows, and the applied thresholds over time."""
    tokens = res.input_len + res.output_len
    edges = np.linspace(0.0, res.sim_seconds, bins + 1)
    per_bin, _ = np.histogram(res.finish_s, bins=edges, weights=tokens)
    width = edges[1] - edges[0]
    return {
        "t": ((edges[:-1] + edges[1:]) / 2).tolist(),
        "tok_per_s": (per_bin / width).tolist(),
        "timeline": res.timeline,
        "phase_starts": [b[3] for b in res.phase_bounds],
    }


def _typical_thresholds(res: SimResult) -> tuple[int | None, int]:
    """Time-weighted median k (while exclusive) and N over the run: the final values are the drain's."""
    tl = res.timeline
    ends = [t for t, *_ in tl[1:]] + [res.sim_seconds]
    spans = np.array([max(0.0, e - t) for (t, *_), e in zip(tl, ends, strict=True)])

    def median(values: list[int], weights: np.ndarray) -> int | None:
        if weights.sum() <= 0:
            return None
        order = np.argsort(values)
        cum = np.cumsum(weights[order])
        return int(np.asarray(values)[order][np.searchsorted(cum, cum[-1] / 2)])

    eb = np.array([a == "eb" for *_, a in tl])
    k = median([k for _, k, _, _ in tl], spans * eb)
    return k, median([n for _, _, n, _ in tl], spans) or res.n_final


def controller_for(slo: SloTargets | None) -> ControllerConfig | None:
    """The online policies' controller for a goodput setting: told the targets it is scored by.

    An operator who cares about latency sets ``controller.planner.slo``; the simulator's
    per-request ITL criterion is each request's longest gap, which is the planner's
    ``max_stall_s``.
    """
    if slo is None or (slo.ttft_s is None and slo.itl_s is None):
        return None
    return ControllerConfig(planner=PlannerConfig(slo=SloConfig(ttft_p99_s=slo.ttft_s, max_stall_s=slo.itl_s)))


def run_task(task: Task) -> dict:
    """One policy on one setting, for each seed; returns the first seed's summary with the mean value."""
    prof = sim_profile(task.profile)
    st = task.setting
    out: dict = {}
    values, phases, latency = [], [], []
    for i, seed in enumerate(task.seeds):
        reqs = build_requests(load_source(st.workload), seed=seed, requests=st.requests, concurrency=st.concurrency,
                              rate=st.rate, burst_cv=st.burst_cv, scale=task.scale)  # fmt: skip
        cfg = SimConfig(policy=task.policy, k=task.k, n=task.n, budget=BUDGET, slo=task.slo,
                        controller=controller_for(task.slo))  # fmt: skip
        res = simulate(prof, reqs, cfg)
        figures = res.as_json()
        latency.append([figures[key] for key in LATENCY_KEYS] + [res.switches_after(WARMUP_COMPLETIONS)])
        if st.metric == "goodput":
            values.append(figures["goodput_req_per_s"])
        else:
            values.append(res.steady_tok_per_s() if st.metric == "steady" else res.tok_per_s)
        phases.append(res.phase_tok_per_s() if len(res.phase_bounds) > 1 else None)
        if i == 0:
            out = res.as_json()
            out["k"], out["n"] = task.k, task.n
            out["k_typical"], out["n_typical"] = _typical_thresholds(res)
            if task.series:
                out["series"] = _series(res)
    out["value"] = float(np.mean(values))
    out["values"] = values
    means = np.mean(latency, axis=0).tolist()
    out["latency"] = dict(zip(LATENCY_KEYS, means[:-1], strict=True))
    out["switches_after_warmup"] = int(sum(row[-1] for row in latency))  # over all seeds
    out["phase_tok_per_s"] = None if phases[0] is None else np.mean(phases, axis=0).tolist()
    return out


def _pool_map(fn: Callable, items: list, workers: int, bar) -> list:
    if workers <= 1:
        out = []
        for item in items:
            out.append(fn(item))
            bar.update(1)
        return out
    with ProcessPoolExecutor(workers) as pool:
        futures = [pool.submit(fn, item) for item in items]
        out = []
        for f in futures:
            out.append(f.result())
            bar.update(1)
        return out


def _k_grid(n: int, coarse: bool) -> list[int]:
    top = max(1, n // 2)
    step = 4 if coarse else 2
    grid, k = [], 1
    while k <= top:
        grid.append(k)
        k *= step
    return grid


def _refine(best_k: int, tried: Iterable[int], n: int) -> list[int]:
    cand = {max(1, round(best_k / math.sqrt(2))), min(n - 1, round(best_k * math.sqrt(2)))}
    return sorted(cand - set(tried))


# ---------------------------------------------------------------------------
# the grid


def run_grid(
    profiles: list[str], quick: bool, tuning: tuple[int, ...], evaluation: tuple[int, ...], workers: int
) -> dict:
    """Every policy on the ``evaluation`` seeds; the best fixed k is picked by a sweep on the ``tuning`` seeds.

    The fixed k is a hindsight choice: the best of a dozen noisy values is biased up by
    the noise it was picked on. Picking on one set of request seeds and reporting it, like
    every other policy, on another keeps that luck out of the comparison.
    """
    from tqdm import tqdm

    scale = 0.25 if quick else 1.0
    settings = SETTINGS
    results: dict = {p: {s.key: {} for s in settings} for p in profiles}
    bar = tqdm(total=0, desc="bench-sim", unit="run", dynamic_ncols=True)

    def submit(tasks: list[Task]) -> list[dict]:
        bar.total += len(tasks)
        bar.refresh()
        return _pool_map(run_task, tasks, workers, bar)

    # stage 1: the policies without a sweep
    named = {
        "mb": (Policy.MB, None),
        "v0": (Policy.V0, None),
        "eb-online": (Policy.EB, None),
        "eb+": (Policy.EBPLUS, None),
    }
    tasks = [
        Task(p, s, pol, k, s.n, evaluation, scale, series=s.kind == "shift")
        for p in profiles
        for s in settings
        for pol, k in named.values()
    ]
    keys = [(p, s.key, name) for p in profiles for s in settings for name in named]
    for key, out in zip(keys, submit(tasks), strict=True):
        results[key[0]][key[1]][key[2]] = out
    # stage 2+: fixed-k sweeps at the online run's N and at max_num_seqs, on the tuning seeds
    by_key = {s.key: s for s in settings}
    sweeps: dict[tuple[str, str, int], dict[int, dict]] = {}
    for p in profiles:
        for s in settings:
            for n in sorted({results[p][s.key]["eb-online"]["n_final"], s.n}):
                sweeps[(p, s.key, n)] = {}
    pending = {key: _k_grid(key[2], quick) for key in sweeps}
    rounds = 1 if quick else 3
    for _ in range(rounds):
        tasks = [
            Task(p, by_key[sk], Policy.EB, k, n, tuning, scale) for (p, sk, n), ks in pending.items() for k in ks
        ]  # fmt: skip
        if not tasks:
            break
        outs = submit(tasks)
        for t, out in zip(tasks, outs, strict=True):
            sweeps[(t.profile, t.setting.key, t.n)][t.k] = out
        pending = {}
        for key, tried in sweeps.items():
            best = max(tried.values(), key=lambda o: o["value"])
            more = _refine(best["k"], tried, key[2])
            if more:
                pending[key] = more
    picked: dict[tuple[str, str], dict] = {}
    for (p, sk, n), tried in sweeps.items():
        best = max(tried.values(), key=lambda o: o["value"])
        if (p, sk) not in picked or best["value"] > picked[(p, sk)]["value"]:
            picked[(p, sk)] = best
        results[p][sk].setdefault("sweep", {})[str(n)] = {str(k): o["value"] for k, o in sorted(tried.items())}
    # the picked (k, N), measured on the evaluation seeds like the other policies
    keys = list(picked)
    tasks = [
        Task(p, by_key[sk], Policy.EB, picked[(p, sk)]["k"], picked[(p, sk)]["n"], evaluation, scale,
             series=by_key[sk].kind == "shift")
        for p, sk in keys
    ]  # fmt: skip
    for (p, sk), out in zip(keys, submit(tasks), strict=True):
        out["tuning_value"] = picked[(p, sk)]["value"]
        results[p][sk]["eb-best"] = out
    bar.close()
    return results


def fluid_check(profiles: list[str], quick: bool, seed: int) -> list[dict]:
    """Simulated EB(k0*) vs TP_EB for geometric outputs, each profile without its KV term and truth-only costs.

    The closed forms have neither, so the check compares the fluid model with the simulator on their common ground.
    """
    rows = []
    wl = load_source("geometric")
    for name in profiles:
        prof = sim_profile(name).model_copy(update={"beta_kv": 0.0, "kv_capacity_tokens": 10**9, "truth": None})
        for n in (512, 1024) if quick else (512, 1024, 2048):
            mu_l, mu_o = 512.0, 256.0
            k = theory.k_star(theory.theta0(1 / mu_o, prof.alpha_p, prof.alpha_d), n)
            reqs = build_requests(wl, seed=seed, requests=(10 if quick else 30) * n)
            res = simulate(prof, reqs, SimConfig(policy=Policy.EB, k=k, n=n, budget=1 << 22))
            tp = theory.tp_eb(k, n, prof.alpha_p, prof.alpha_d, prof.beta_p, prof.beta_d, mu_l, mu_o)
            rows.append({"profile": name, "n": n, "k0": k, "theory_req_s": tp, "sim_req_s": res.steady_req_per_s()})
    return rows


def speed_check(
    profile: str,
    workloads: tuple[str, ...] = ("paper", "decode-heavy"),
    policies: tuple[Policy, ...] = (Policy.MB, Policy.EB, Policy.EBPLUS),
) -> list[dict]:
    """Wall and CPU time of 50,000-request saturated runs at N = 1024 (one process, this machine).

    The target is under 5 s wall each; CPU time is shown too because a shared
    machine's wall time measures its other tenants as much as the simulator.
    """
    prof = sim_profile(profile)
    rows = []
    for wl in workloads:
        reqs = build_requests(load_source(wl), seed=0, requests=50_000)
        for pol in policies:
            t0, c0 = time.perf_counter(), time.process_time()
            res = simulate(prof, reqs, SimConfig(policy=pol, n=1024, budget=BUDGET))
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            steps = sum(res.steps.values())
            rows.append({"workload": wl, "policy": pol.value, "wall_s": wall, "cpu_s": cpu, "steps": steps,
                         "sim_s": res.sim_seconds})  # fmt: skip
    return rows


# ---------------------------------------------------------------------------
# report


def _fmt(x: float) -> str:
    return f"{x:,.0f}"


def summary_rows(results: dict) -> dict:
    """The acceptance figures: online/best-fixed, EB+/max(MB, best EB), non-stationary gains, paper shape.

    ``shift_gains`` rows are ``(profile, setting, vs MB, vs best fixed k, vs online EB)``, relative gains.
    """
    online, capped, ebplus, shift, shape = [], [], [], [], []
    for p, per in results.items():
        for key, r in per.items():
            setting = next(s for s in SETTINGS if s.key == key)
            best_eb = max(r["eb-best"]["value"], r["eb-online"]["value"])
            if setting.kind == "synthetic":
                online.append((p, key, r["eb-online"]["value"] / r["eb-best"]["value"]))
            if setting.kind == "capped":
                capped.append((p, key, r["eb-online"]["value"] / r["eb-best"]["value"]))
            ebplus.append((p, key, r["eb+"]["value"] / max(r["mb"]["value"], best_eb)))
            if setting.kind == "shift":
                gain = [r["eb+"]["value"] / r[col]["value"] - 1 for col in ("mb", "eb-best", "eb-online")]
                shift.append((p, key, *gain))
            if setting.kind == "paper":
                c = setting.concurrency
                paper = PAPER_EB_OVER_MB.get(p, {}).get(c)
                shape.append((p, c, r["eb-online"]["value"] / r["mb"]["value"], best_eb / r["mb"]["value"], paper))
    return {"online_vs_best": online, "ebplus_vs_max": ebplus, "shift_gains": shift, "paper_shape": shape,
            "online_vs_best_capped": capped}  # fmt: skip


def markdown(
    results: dict, summary: dict, fluid: list[dict], speed: list[dict], command: str, seeds: tuple[int, ...]
) -> str:
    out = ["# Simulator benchmark", "", f"Made by `{command}`. Total tokens/s, each the mean over request seeds "
           f"{', '.join(map(str, seeds))}; the best fixed k was picked by a sweep on the seeds before those. "
           "Saturated synthetic settings in steady state, the others over the whole run.", ""]  # fmt: skip
    for p, per in results.items():
        out += [f"## {p}", ""]
        out += [
            "| setting | MB | v0 | EB best fixed k (k, N) | EB online (median k̂, N̂) | EB+ (switches) | online / best "
            "| EB+ / max |"
        ]
        out += ["|---|---|---|---|---|---|---|---|"]
        for key, r in per.items():
            best, on, ebp = r["eb-best"], r["eb-online"], r["eb+"]
            best_eb = max(best["value"], on["value"])
            out.append(
                f"| {key} | {_fmt(r['mb']['value'])} | {_fmt(r['v0']['value'])} | {_fmt(best['value'])} "
                f"({best['k']}, {best['n']}) | {_fmt(on['value'])} ({on['k_typical'] or '-'}, {on['n_typical']}) | "
                f"{_fmt(ebp['value'])} ({ebp['mode_switches']}) | {on['value'] / best['value']:.3f} | "
                f"{ebp['value'] / max(r['mb']['value'], best_eb):.3f} |"
            )
        out.append("")
    ratios = [x[2] for x in summary["online_vs_best"]]
    out += ["## Acceptance figures", ""]
    if ratios:
        worst = min(summary["online_vs_best"], key=lambda x: x[2])
        out.append(f"- Online EB / best fixed k (synthetic): min **{min(ratios):.3f}** ({worst[0]}, {worst[1]}), "
                   f"mean {np.mean(ratios):.3f}.")  # fmt: skip
    capped = summary.get("online_vs_best_capped") or []
    if capped:
        worst = min(capped, key=lambda x: x[2])
        out.append(f"- Online EB / best fixed k (capped): min **{worst[2]:.3f}** ({worst[0]}, {worst[1]}), "
                   f"mean {np.mean([x[2] for x in capped]):.3f}.")  # fmt: skip
    eb = summary["ebplus_vs_max"]
    worst = min(eb, key=lambda x: x[2])
    out.append(f"- EB+ / max(MB, best EB), every setting: min **{worst[2]:.3f}** ({worst[0]}, {worst[1]}).")
    for p, key, vs_mb, vs_fixed, vs_online in summary["shift_gains"]:
        out.append(f"- {p} {key}: EB+ {100 * vs_mb:+.1f}% vs MB, {100 * vs_fixed:+.2f}% vs the best fixed k, "
                   f"{100 * vs_online:+.2f}% vs online EB.")  # fmt: skip
    out += ["", "Paper shape, EB / MB total throughput at (512,256):", ""]
    out += ["| profile | c | online EB / MB | best EB / MB | paper EB / MB |", "|---|---|---|---|---|"]
    for p, c, on, best, paper in summary["paper_shape"]:
        out.append(f"| {p} | {c} | {on:.2f} | {best:.2f} | {'-' if paper is None else f'{paper:.2f}'} |")
    if fluid:
        out += ["", "Fluid limit: geometric outputs (mean 256), 512-token prompts, EB(k0*), no KV term:", ""]
        out += ["| profile | N | k0* | TP_EB theory (req/s) | simulated | error |", "|---|---|---|---|---|---|"]
        for f in fluid:
            err = f["sim_req_s"] / f["theory_req_s"] - 1
            out.append(f"| {f['profile']} | {f['n']} | {f['k0']} | {f['theory_req_s']:.3f} | {f['sim_req_s']:.3f} "
                       f"| {100 * err:+.2f}% |")  # fmt: skip
    if speed:
        out += ["", "Speed: 50,000 requests, saturated, N = 1024, one process:", ""]
        out += ["| workload | policy | wall s | steps | CPU s |", "|---|---|---|---|---|"]
        for s in speed:
            out.append(f"| {s['workload']} | {s['policy']} | {s['wall_s']:.2f} | {s['steps']:,} | {s['cpu_s']:.2f} |")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------
# plots


COLORS = {"mb": "#4c72b0", "v0": "#8172b2", "eb-best": "#55a868", "eb-online": "#c44e52", "eb+": "#dd8452"}


def plot_throughput(results: dict, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for p, per in results.items():
        keys = list(per)
        fig, ax = plt.subplots(figsize=(11, 4))
        width = 0.16
        x = np.arange(len(keys))
        for i, col in enumerate(POLICY_COLUMNS):
            vals = [per[k][col]["value"] / per[k]["mb"]["value"] for k in keys]
            ax.bar(x + (i - 2) * width, vals, width, label=col, color=COLORS[col])
        ax.axhline(1.0, color="k", lw=0.6)
        ax.set_xticks(x, [f"{k}\nMB {per[k]['mb']['value'] / 1000:.1f}k tok/s" for k in keys], fontsize=8)
        ax.set_ylabel("total throughput / MB")
        ax.set_title(f"{p}: throughput by policy (relative to MB)")
        ax.legend(ncol=5, fontsize=8, loc="upper left")
        lo = min(per[k][c]["value"] / per[k]["mb"]["value"] for k in keys for c in POLICY_COLUMNS)
        ax.set_ylim(max(0.0, lo - 0.1), None)
        fig.tight_layout()
        path = out_dir / f"throughput_{p}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def plot_timelines(results: dict, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for p, per in results.items():
        shifts = [s.key for s in SETTINGS if s.kind == "shift" and s.key in per]
        if not shifts:
            continue
        fig, axes = plt.subplots(2, len(shifts), figsize=(6 * len(shifts), 6), sharex="col", squeeze=False)
        for j, key in enumerate(shifts):
            r = per[key]
            top, bottom = axes[0][j], axes[1][j]
            for col, style in (("eb-online", "-"), ("eb+", "-")):
                tl = r[col]["series"]["timeline"]
                ts = [t for t, *_ in tl] + [r[col]["sim_seconds"]]
                ks = [k for _, k, _, _ in tl]
                top.step(ts, [*ks, ks[-1]], where="post", ls=style, color=COLORS[col], label=f"k ({col})")
            tl = r["eb+"]["series"]["timeline"]
            ends = [t for t, *_ in tl[1:]] + [r["eb+"]["sim_seconds"]]
            for (t, _, _, mode), t_end in zip(tl, ends, strict=True):
                if mode == "mb":
                    top.axvspan(t, t_end, color=COLORS["mb"], alpha=0.15, lw=0)
            top.set_yscale("log")
            top.set_ylabel("k (log); shaded: EB+ in MB")
            top.set_title(f"{p}: {key}")
            top.legend(fontsize=8)
            for col in POLICY_COLUMNS:
                s = r[col].get("series")
                if s is None:
                    continue
                y = np.convolve(s["tok_per_s"], np.ones(5) / 5, mode="same")
                bottom.plot(s["t"], y, color=COLORS[col], label=col, lw=1.2)
            for t in r["eb+"]["series"]["phase_starts"][1:]:
                top.axvline(t, color="grey", lw=0.5, ls=":")
                bottom.axvline(t, color="grey", lw=0.5, ls=":")
            bottom.set_xlabel("simulated seconds (EB+ run's phase starts dotted)")
            bottom.set_ylabel("completed tokens/s")
            bottom.legend(fontsize=8, ncol=3)
        fig.tight_layout()
        path = out_dir / f"timeline_{p}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def _first_paragraph(module: object) -> str:
    return str(module.__doc__).split("\n\n")[1].replace("\n", " ")


def main(args: argparse.Namespace) -> int:
    profiles = args.profiles.split(",") if args.profiles else profile_names()
    for name in profiles:
        sim_profile(name)  # fail fast, one line
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    workers = args.workers or os.cpu_count() or 1
    started = time.perf_counter()
    n_seeds = args.seeds or (1 if args.quick else 3)
    tuning = tuple(range(args.seed, args.seed + n_seeds))
    seeds = tuple(range(args.seed + n_seeds, args.seed + 2 * n_seeds))
    results = run_grid(profiles, args.quick, tuning, seeds, workers)
    # NOTE: imported here: bench_open builds on this module's tasks and sweep helpers
    from benchmarks import bench_open

    open_results = bench_open.run_open_grid(profiles, args.quick, tuning, seeds, workers)
    open_summary = bench_open.summary(open_results)
    fluid = fluid_check(profiles, args.quick, args.seed)
    speed = [] if args.quick else speed_check("h200" if "h200" in profiles else profiles[0])
    summary = summary_rows(results)
    command = (
        "ebplus bench sim"
        + (" --quick" if args.quick else "")
        + (f" --profiles {args.profiles}" if args.profiles else "")
        + (f" --seeds {args.seeds}" if args.seeds else "")
    )
    text = markdown(results, summary, fluid, speed, command, seeds)
    text += "\n".join(bench_open.markdown(open_results, open_summary)) + "\n" if open_results else ""
    if not args.quick:  # the closed forms against the simulator, and the estimate from a cold start
        for title, module, lines in (
            (
                "Closed forms vs simulator",
                model_check,
                model_check.markdown(model_check.rows(profiles, workers=workers)),
            ),
            ("Cold start", cold_start, cold_start.markdown(cold_start.rows())),
        ):
            text += "\n" + "\n".join([f"## {title}", "", _first_paragraph(module), "", *lines]) + "\n"
    (out_dir / "bench_sim.md").write_text(text)
    payload = {"results": results, "summary": summary, "fluid": fluid, "speed": speed, "command": command,
               "settings": [asdict(s) for s in SETTINGS], "seeds": list(seeds), "tuning_seeds": list(tuning),
               "open_loop": {"results": open_results, "summary": open_summary}}  # fmt: skip
    raw = raw_path(out_dir / "bench_sim.md")
    raw.write_text(json.dumps(payload, indent=1))
    if not args.no_plots:
        plot_throughput(results, out_dir)
        plot_timelines(results, out_dir)
    print(text)
    print(f"wrote {out_dir}/bench_sim.md, {raw} and plots in {time.perf_counter() - started:.0f} s")
    return 0
