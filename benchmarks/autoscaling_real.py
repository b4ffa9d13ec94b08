"""Policy-first against Ray Serve's default autoscaler on a real deployment: one CPU replica to two under a ramp.

    python -m benchmarks.autoscaling_real [--rounds 2] [--ttft-s 1.0] [--quick]
                                          [--out docs/benchmarks/results/autoscaling-real.md]

Each round starts ``ebplus serve --config benchmarks/autoscaling_real.yaml`` (SmolLM2-135M on CPU, EB+ on,
``min_replicas: 1, max_replicas: 2``) once per autoscaler, ``replicas.autoscaling.policy`` set to ``default``
(Serve's own) or ``policy-first`` and the controller's TTFT target (``controller.planner.slo.ttft_p99_s``) to
``--ttft-s``; the order alternates from round to round. After a short warm-up it plays the same open-loop trace
against it: fixed arrival times (Poisson phases, seed 0) from a low rate up to one that a single replica here
cannot serve within the target, and back. Every request streams ``--max-tokens`` tokens (``ignore_eos``), chat
and completions alternating (the harness's load).

Per run, over a fixed window (the trace and ``--tail-s`` after it, the same for every run):

* replica-seconds: Serve's model replicas in any state (starting and stopping ones are paid for), polled every
  0.5 s through a Ray driver and integrated;
* scale events: when the replicas asked for (every state but ``STOPPING``) went up or down;
* attainment: the share of the trace's requests whose time to first token met the target (a failed request
  misses), with TTFT p50/p99 and end-to-end p99;
* for policy-first, the controller's scaling decisions (``GET /admin/history``'s ``scaling``, polled and merged)
  counted by action.

It reports medians with min-max over the rounds; a difference inside the rounds' spread is no difference.
On two cores two replicas share the same cores (and the client, Ray and the ingress): scale-out may add no
capacity here, and the results page says what it measured, not what a GPU fleet would.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import random
import secrets
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from benchmarks.e2e_bench import warm_up
from benchmarks.outputs import SUMMARY_DIR, command_line, interleaved, spread, write_summary
from harness import Cluster, Deployment, start_deployment, stop_deployment
from harness.load import BackgroundLoad, Outcome, percentile

#: Relative to the repository root, where the benchmarks run (as :data:`~benchmarks.outputs.SUMMARY_DIR`).
CONFIG = Path("benchmarks/autoscaling_real.yaml")
POLICIES = ("default", "policy-first")
SAMPLE_EVERY_S = 0.5
HISTORY_EVERY_S = 2.0
#: Serve's replica states that are not (or no longer) asked for: a replica draining after a scale-down.
LEAVING = frozenset({"STOPPING"})


@dataclass(frozen=True)
class Phase:
    """A stretch of the trace: Poisson arrivals at ``rate`` requests/s for ``seconds``."""

    rate: float
    seconds: float


#: Low, up, a peak one replica here cannot serve within a 1 s TTFT, down, and low long enough for a scale-down.
#: One replica with this config, 20 s at each rate: TTFT p50/p99 0.32/0.58 s at 2 requests/s, 0.37/1.7 s at 3,
#: 4.4/9.5 s at 4 (its queue grows).
TRACE = (Phase(1, 30), Phase(2, 15), Phase(3.5, 90), Phase(2, 15), Phase(1, 45))
QUICK_TRACE = (Phase(1, 10), Phase(3.5, 40), Phase(1, 20))


def arrivals(phases: Sequence[Phase], seed: int = 0) -> list[float]:
    """The trace's arrival times (seconds from its start, ascending): each phase a Poisson process of its rate,
    restarted at the phase's start; the same list for the same phases and seed."""
    rng = random.Random(seed)
    out: list[float] = []
    start = 0.0
    for phase in phases:
        t = start + rng.expovariate(phase.rate)
        while t < start + phase.seconds:
            out.append(t)
            t += rng.expovariate(phase.rate)
        start += phase.seconds
    return out


def replica_seconds(samples: Sequence[tuple[float, int]], start: float, end: float) -> float:
    """The integral of a replica count sampled at times ``samples`` ((t, count), ascending) over [start, end]:
    each sample's count holds until the next one (the first holds back to ``start``)."""
    if not samples or end <= start:
        return 0.0
    total = 0.0
    for i, (t, count) in enumerate(samples):
        lo = start if i == 0 else max(start, t)
        hi = min(end, samples[i + 1][0]) if i + 1 < len(samples) else end
        if hi > lo:
            total += count * (hi - lo)
    return total


def scale_events(samples: Sequence[tuple[float, int]]) -> list[dict]:
    """Each change of a sampled count: its time, ``up`` or ``down``, and the counts before and after."""
    events = []
    for (_, before), (t, after) in itertools.pairwise(samples):
        if after != before:
            events.append({"t": round(t, 1), "kind": "up" if after > before else "down", "from": before, "to": after})
    return events


def slo_figures(outcomes: Sequence[Outcome], ttft_s: float) -> dict:
    """Attainment (the share of requests whose first token came within ``ttft_s``; failed ones miss), TTFT
    p50/p99 and end-to-end p99 of the requests that got one, and the failures."""
    ttft = sorted(o.first - o.started for o in outcomes if o.ok and o.first)
    e2e = sorted(o.ended - o.started for o in outcomes if o.ok)
    met = sum(1 for o in outcomes if o.ok and o.first and o.first - o.started <= ttft_s)
    return {
        "requests": len(outcomes),
        "failed": sum(1 for o in outcomes if not o.ok),
        "attainment": met / len(outcomes) if outcomes else 0.0,
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p99_s": percentile(ttft, 99),
        "e2e_p99_s": percentile(e2e, 99),
    }


class Sampler:
    """A thread that polls Serve's replica states (and the controller's scaling decisions) during a run."""

    def __init__(self, cluster: Cluster, dep: Deployment, history: bool) -> None:
        self.cluster, self.dep, self.history = cluster, dep, history
        self.paid: list[tuple[float, int]] = []  # every replica Serve has, starting and stopping ones too
        self.asked: list[tuple[float, int]] = []  # those not leaving: what the autoscaler asks for
        self.decisions: dict[float, dict] = {}  # ScalingDecision.as_dict by its time
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        next_history = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                states = self.cluster.replica_states()
                self.paid.append((now, sum(states.values())))
                self.asked.append((now, sum(n for s, n in states.items() if s not in LEAVING)))
            except Exception:  # a slow Serve controller under load: the previous sample holds
                self.errors += 1
            if self.history and now >= next_history:
                next_history = now + HISTORY_EVERY_S
                with contextlib.suppress(Exception):
                    for d in self.dep.admin("/admin/history?limit=200")["scaling"]:
                        self.decisions[d["at"]] = d
            self._stop.wait(max(0.0, SAMPLE_EVERY_S - (time.monotonic() - now)))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


def deployment_config(base: Path, policy: str, ttft_s: float, dest: Path) -> Path:
    """A copy of ``base`` with ``replicas.autoscaling.policy`` and the controller's TTFT target set."""
    cfg = yaml.safe_load(base.read_text())
    cfg["replicas"]["autoscaling"]["policy"] = policy
    cfg.setdefault("controller", {}).setdefault("planner", {})["slo"] = {"ttft_p99_s": ttft_s}
    dest.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return dest


def run_once(args: argparse.Namespace, policy: str, round_: int, workdir: Path) -> dict:
    """One deployment under ``policy``: warm-up, the trace, the window's figures."""
    config = deployment_config(Path(args.config), policy, args.ttft_s, workdir / f"{policy}-{round_}.yaml")
    log = workdir / f"serve-{policy}-{round_}.log"
    tag = f"[autoscaling-real] round {round_}, {policy}"
    print(f"{tag}: starting the deployment (log {log})", flush=True)
    started = time.monotonic()
    dep = start_deployment(config, log, secrets.token_hex(16))
    times = arrivals(args.trace, args.seed)
    span = sum(p.seconds for p in args.trace)
    window = span + args.tail_s
    try:
        with Cluster(dep) as cluster:
            warm_up(dep.base_url, dep.model, requests=16)
            print(f"{tag}: {len(times)} requests over {span:.0f} s, window {window:.0f} s", flush=True)
            with Sampler(cluster, dep, history=policy == "policy-first") as sampler:
                with BackgroundLoad(dep, arrivals_s=times, concurrency=64, max_tokens=args.max_tokens,
                                    stream_every=1, ignore_eos=True, max_retries=2) as load:  # fmt: skip
                    t0, wall0 = load.t0, time.time() - (time.monotonic() - load.t0)
                    while time.monotonic() < t0 + span:
                        time.sleep(min(15.0, max(0.1, t0 + span - time.monotonic())))
                        _progress(tag, t0, window, sampler, load)
                result = load.join()
                while time.monotonic() < t0 + window:
                    time.sleep(0.5)
    finally:
        stop_deployment(dep)
    paid = [(t - t0, n) for t, n in sampler.paid if t <= t0 + window]
    asked = [(t - t0, n) for t, n in sampler.asked if t <= t0 + window]
    decisions = sorted(
        ({**d, "at": d["at"] - wall0} for d in sampler.decisions.values() if 0 <= d["at"] - wall0 <= window),
        key=lambda d: d["at"],
    )
    row = {
        "autoscaler": policy,
        "round": round_,
        "replica_seconds": replica_seconds(paid, 0.0, window),
        "window_s": window,
        "scale_events": scale_events(asked),
        "most_replicas": max((n for _, n in paid), default=0),
        **slo_figures(result.outcomes, args.ttft_s),
        "peak": slo_figures(_in_peak(result.outcomes, t0, args.trace), args.ttft_s),
        "decisions": dict(Counter(d["action"] for d in decisions)),
        "decision_log": _changes(decisions),
        "sampler_errors": sampler.errors,
        "samples": len(paid),
        "run_wall_s": time.monotonic() - started,
    }
    print(f"{tag}: {row['replica_seconds']:.0f} replica-s, attainment {row['attainment']:.3f}, TTFT p50 "
          f"{row['ttft_p50_s']} s p99 {row['ttft_p99_s']} s, failed {row['failed']}, events "
          f"{_events(row)}, decisions {row['decisions']}", flush=True)  # fmt: skip
    return row


def _progress(tag: str, t0: float, window: float, sampler: Sampler, load: BackgroundLoad) -> None:
    """The time, the replicas (asked for, all), requests sent and ended."""
    asked = sampler.asked[-1][1] if sampler.asked else "?"
    paid = sampler.paid[-1][1] if sampler.paid else "?"
    done = sum(1 for o in load.live.outcomes if o.ended)
    print(f"{tag}: t={time.monotonic() - t0:.0f}/{window:.0f} s, replicas {asked} asked ({paid} in all), "
          f"sent {load.live.sent}, ended {done}", flush=True)  # fmt: skip


def _events(row: dict) -> str:
    return ", ".join(f"{e['kind']} {e['from']}→{e['to']} at {e['t']:.0f} s" for e in row["scale_events"]) or "none"


def _in_peak(outcomes: Sequence[Outcome], t0: float, trace: Sequence[Phase]) -> list[Outcome]:
    """The requests that arrived during the trace's fastest phase."""
    top = max(range(len(trace)), key=lambda i: trace[i].rate)
    lo = t0 + sum(p.seconds for p in trace[:top])
    return [o for o in outcomes if lo <= o.started < lo + trace[top].seconds]


def _changes(decisions: Sequence[dict]) -> list[dict]:
    """The decisions whose action or target differs from the previous one (the log without its repeats)."""
    out, last = [], None
    for d in decisions:
        key = (d["action"], d["target"])
        if key != last:
            out.append({k: d[k] for k in ("at", "replicas", "target", "action", "demand", "best", "reason")})
            last = key
    return out


def _compare(rows: list[dict], get: Callable[[dict], float], fmt: str, ratio: bool) -> str:
    """Policy-first against the default within each round (ratio or difference), median (min-max); "no
    difference" when the rounds straddle equality or the two autoscalers' ranges overlap."""
    pairs = [{r["autoscaler"]: r for r in rows if r["round"] == n} for n in sorted({r["round"] for r in rows})]
    pairs = [p for p in pairs if set(POLICIES) <= p.keys()]
    if not pairs:
        return "—"
    values = [get(p["policy-first"]) / get(p["default"]) if ratio else get(p["policy-first"]) - get(p["default"])
              for p in pairs]  # fmt: skip
    one, other = [get(p["default"]) for p in pairs], [get(p["policy-first"]) for p in pairs]
    same = min(values) <= (1 if ratio else 0) <= max(values) or (min(other) <= max(one) and min(one) <= max(other))
    return spread(values, fmt) + ("×" if ratio else "") + (" — no difference" if same else "")


def markdown(rows: list[dict], args: argparse.Namespace, command: str, wall_s: float) -> list[str]:
    """The results page: the setup, per autoscaler the medians over the rounds, each run, the comparison."""
    trace = ", ".join(f"{p.rate:g} req/s for {p.seconds:g} s" for p in args.trace)
    auto = yaml.safe_load(Path(args.config).read_text())["replicas"]["autoscaling"]
    rounds = sorted({r["round"] for r in rows})
    lines = [
        f"Command: `{command}` ({wall_s / 60:.0f} min). `ebplus serve --config {args.config}`: SmolLM2-135M on "
        f"CPU (this machine: 2 cores, shared by the replicas, Ray, the ingress and the client), EB+ on, from "
        f"{auto['min_replicas']} to {auto['max_replicas']} replicas; upscale delay {auto['upscale_delay_s']} s, "
        f"downscale delay {auto['downscale_delay_s']} s, Serve's metrics every {auto['metrics_interval_s']} s over "
        f"{auto['look_back_period_s']} s; the default autoscaler targets {auto['target_ongoing_requests']} ongoing "
        f"requests a replica. TTFT target {args.ttft_s:g} s (`controller.planner.slo.ttft_p99_s`, and attainment: "
        f"the share of requests whose first token came within it; a failed request misses).",
        "",
        f"Trace (open loop, fixed arrivals, seed {args.seed}): {trace}; {len(arrivals(args.trace, args.seed))} "
        f"requests, each streaming {args.max_tokens} tokens. Window: the trace and {args.tail_s:g} s after it "
        f"({rows[0]['window_s']:g} s), the same for every run. Replica-seconds count every replica Serve has in any "
        f"state (starting and stopping ones are paid for), sampled every {SAMPLE_EVERY_S:g} s. {len(rounds)} "
        "round(s), each autoscaler once a round, the order alternating. Median (min–max) over the rounds.",
        "",
        "| autoscaler | replica-seconds | TTFT attainment | at the peak | TTFT p50 (s) | TTFT p99 (s) | E2E p99 (s) "
        "| failed | scale events (up/down) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for policy in POLICIES:
        runs = [r for r in rows if r["autoscaler"] == policy]
        if not runs:
            continue
        ups = [sum(e["kind"] == "up" for e in r["scale_events"]) for r in runs]
        downs = [sum(e["kind"] == "down" for e in r["scale_events"]) for r in runs]
        lines.append(
            f"| {policy} | {spread([r['replica_seconds'] for r in runs], ',.0f')} "
            f"| {spread([r['attainment'] for r in runs], '.3f')} | {spread([r['peak']['attainment'] for r in runs], '.3f')} "
            f"| {spread([r['ttft_p50_s'] for r in runs], '.2f')} | {spread([r['ttft_p99_s'] for r in runs], '.2f')} "
            f"| {spread([r['e2e_p99_s'] for r in runs], '.2f')} | {sum(r['failed'] for r in runs)} "
            f"| {spread(ups, '.0f')} / {spread(downs, '.0f')} |"
        )
    lines += [
        "",
        "Policy-first against the default autoscaler, round by round: replica-seconds "
        f"{_compare(rows, lambda r: r['replica_seconds'], '.3f', True)}; TTFT attainment {_compare(rows, lambda r: r['attainment'], '+.3f', False)}"
        f" (at the peak {_compare(rows, lambda r: r['peak']['attainment'], '+.3f', False)}).",
        "",
        "Each run (times in seconds from the trace's start; the scale events are the replicas asked for, as Serve "
        "reported them; decisions: policy-first's answers in `/admin/history`, by action):",
        "",
        "| round | autoscaler | replica-seconds | attainment | TTFT p50 / p99 (s) | failed | scale events | "
        "decisions | run wall time (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["round"], r["autoscaler"])):
        decisions = ", ".join(f"{k} {v}" for k, v in sorted(r["decisions"].items())) or "—"
        lines.append(
            f"| {r['round']} | {r['autoscaler']} | {r['replica_seconds']:,.0f} | {r['attainment']:.3f} "
            f"| {r['ttft_p50_s']} / {r['ttft_p99_s']} | {r['failed']} | {_events(r)} | {decisions} | {r['run_wall_s']:.0f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(CONFIG), help="the deployment (autoscaling from 1 to 2 replicas)")
    parser.add_argument(
        "--rounds", type=int, default=2, help="rounds; each runs both autoscalers (about 12 min a round here)"
    )
    parser.add_argument("--ttft-s", type=float, default=1.0, help="TTFT target (s)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tail-s", type=float, default=10.0, help="seconds of the window after the trace")
    parser.add_argument("--policies", default=",".join(POLICIES), type=lambda s: s.split(","))
    parser.add_argument("--quick", action="store_true", help="a 70 s trace, one round: a check that it runs")
    parser.add_argument("--out", default=str(SUMMARY_DIR / "autoscaling-real.md"))
    args = parser.parse_args(argv)
    args.trace = QUICK_TRACE if args.quick else TRACE
    if args.quick:
        args.rounds = 1
    started = time.monotonic()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="ebplus-autoscaling-") as tmp:
        for round_, policy in interleaved(args.rounds, args.policies):
            rows.append(run_once(args, policy, round_, Path(tmp)))
    lines = markdown(rows, args, command_line("benchmarks.autoscaling_real", argv), time.monotonic() - started)
    write_summary(
        Path(args.out), "Autoscaling on a real deployment: 1 → 2 CPU replicas", lines, rows, "autoscaling_real"
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
