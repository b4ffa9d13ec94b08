"""Generate the Grafana dashboards (and their README section) from code.

    python -m ebplus.dashboards.generate           # write dashboards/*.json, the chart's copies, docs/reference/dashboards.md
    python -m ebplus.dashboards.generate --check   # exit 1 if any committed file differs

Every metric a query names goes through :func:`metric`, which accepts only names in
:data:`controller.exporter.METRICS` (the app's ``ebplus_*`` metrics) or
:data:`dashboards.external.EXTERNAL_METRICS` (vLLM's ``ray_vllm_*`` and Ray Serve's
``ray_serve_*``), so a renamed metric breaks the generator instead of leaving a
panel on "No data". The data source is the variable ``$datasource`` (no hard-coded
UIDs); per-replica panels filter on the ``$model`` and ``$replica`` variables.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ebplus.controller.exporter import SPECS
from ebplus.dashboards.external import EXTERNAL
from ebplus.dashboards.promql import base_name, metric_names

ROOT = Path(__file__).resolve().parent.parent
OUT_DIRS = (ROOT / "dashboards", ROOT / "helm" / "ebplus" / "dashboards")
README_SECTION = ROOT / "docs" / "reference" / "dashboards.md"

DS = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"
HISTOGRAMS = {n for n, s in (*SPECS.items(), *EXTERNAL.items()) if s.kind == "histogram"}


# -- queries ---------------------------------------------------------------------


def metric(name: str, suffix: str = "", **matchers: str) -> str:
    """A selector of a declared metric, filtered on the dashboard variables it has labels for.

    ``suffix`` is ``_bucket``/``_sum``/``_count`` for histograms. Matchers given as
    keyword arguments are added verbatim (``status_code='=~"5.."'``).
    """
    spec = SPECS.get(name) or EXTERNAL.get(name)
    if spec is None:
        raise KeyError(f"{name} is neither in controller.exporter.METRICS nor in dashboards.external")
    if suffix and spec.kind != "histogram":
        raise ValueError(f"{name} is a {spec.kind}, not a histogram")
    if spec.kind == "histogram" and not suffix:
        raise ValueError(f"{name} is a histogram: select _bucket, _sum or _count")
    labels = set(spec.labels)
    parts = []
    if "model" in labels:
        parts.append('model=~"$model"')
    if "replica" in labels:
        parts.append('replica=~"$replica"')
    if "model_name" in labels:
        parts.append('model_name=~"$model"')
    if "ReplicaId" in labels:
        parts.append('ReplicaId=~"$vllm_replica"')
    parts.extend(f"{k}{v}" for k, v in matchers.items())
    return name + suffix + ("{" + ", ".join(parts) + "}" if parts else "")


def quantile(q: float, name: str, by: str = "", **matchers: str) -> str:
    """``histogram_quantile`` over a histogram, summed over everything but ``le`` and ``by``."""
    keep = ", ".join(["le", *[b.strip() for b in by.split(",") if b.strip()]])
    return f"histogram_quantile({q}, sum by ({keep}) (rate({metric(name, '_bucket', **matchers)}[{RATE}])))"


# -- panels ----------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str = ""


@dataclass
class Panel:
    title: str
    description: str
    targets: list[Target]
    unit: str = "short"
    kind: str = "timeseries"  # timeseries | stat | state-timeline
    width: int = 12
    mappings: list[dict] = field(default_factory=list)
    decimals: int | None = None


@dataclass
class Row:
    title: str
    panels: list[Panel]


@dataclass
class Dashboard:
    uid: str
    title: str
    description: str
    variables: list[dict]
    rows: list[Row]
    file: str


def _datasource_var() -> dict:
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "refresh": 1,
        "regex": "",
    }


def _query_var(name: str, label: str, query: str) -> dict:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "definition": query,
        "query": {"query": query, "refId": f"{name}-var"},
        "refresh": 2,
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
        "hide": 0,
        "regex": "",
    }


EB_MB = [
    {
        "type": "value",
        "options": {
            "0": {"text": "MB (mixed)", "color": "blue", "index": 0},
            "1": {"text": "EB (exclusive)", "color": "orange", "index": 1},
        },
    }
]


def control_plane() -> Dashboard:
    by_replica = "{{replica}}"
    return Dashboard(
        uid="ebplus-control-plane",
        title="EB+ control plane",
        description="What the EB+ controller estimated and decided, per replica and fleet-wide.",
        file="ebplus-control-plane.json",
        variables=[
            _datasource_var(),
            _query_var("model", "Model", "label_values(ebplus_threshold_k, model)"),
            _query_var("replica", "Replica", 'label_values(ebplus_threshold_k{model=~"$model"}, replica)'),
        ],
        rows=[
            Row(
                "Decisions (per replica)",
                [
                    Panel(
                        "Active policy per replica",
                        "The batching policy each replica runs over time: EB (exclusive prefill/decode phases) or "
                        "MB (mixed steps). In mode auto the controller switches it at the EB/MB crossover.",
                        [Target(f"max by (replica) ({metric('ebplus_policy_eb')})", by_replica)],
                        kind="state-timeline",
                        mappings=EB_MB,
                    ),
                    Panel(
                        "Configured mode per replica",
                        "The mode each replica was configured with (mb, eb, v0 or auto = EB+), or an operator override.",
                        [
                            Target(
                                f"max by (replica, mode) ({metric('ebplus_mode_info')}) == 1", "{{replica}}: {{mode}}"
                            )
                        ],
                        kind="stat",
                    ),
                    Panel(
                        "EB threshold k, batch cap N and N*",
                        "k: free slots that trigger a prefill phase; N: cap on running requests; N*: the memory-safe "
                        "batch size of the latest plan (eq. 6). Requests.",
                        [
                            Target(f"max by (replica) ({metric('ebplus_threshold_k')})", "k {{replica}}"),
                            Target(f"max by (replica) ({metric('ebplus_batch_cap_n')})", "N {{replica}}"),
                            Target(f"max by (replica) ({metric('ebplus_n_star')})", "N* {{replica}}"),
                        ],
                    ),
                    Panel(
                        "Threshold fractions θ0, Δθ, θ*",
                        "θ0: CFR threshold (eq. 3); Δθ: the IFR correction for rising hazards (eq. 5); "
                        "θ* = θ0 + Δθ (clamped); θ: the smoothed value k is computed from (k = θ·N).",
                        [
                            Target(f"max by (replica) ({metric('ebplus_theta0')})", "θ0 {{replica}}"),
                            Target(f"max by (replica) ({metric('ebplus_delta_theta')})", "Δθ {{replica}}"),
                            Target(f"max by (replica) ({metric('ebplus_theta_star')})", "θ* {{replica}}"),
                            Target(f"max by (replica) ({metric('ebplus_theta')})", "θ {{replica}}"),
                        ],
                        unit="percentunit",
                    ),
                    Panel(
                        "Mode switches (EB↔MB)",
                        "Changes of the active policy per replica in the last hour. Frequent switching means the "
                        "workload sits at the crossover; hysteresis and cooldown bound it.",
                        [
                            Target(
                                f"max by (replica) (increase({metric('ebplus_mode_switches_total')}[1h]))", by_replica
                            )
                        ],
                    ),
                    Panel(
                        "Phase switches per second",
                        "Switches between prefill and decode phases of the EB scheduler (0 in MB).",
                        [
                            Target(
                                f"sum by (replica) (rate({metric('ebplus_phase_switches_total')}[{RATE}]))", by_replica
                            )
                        ],
                        unit="ops",
                    ),
                    Panel(
                        "EB/MB crossover margin",
                        "The fixed-cost saving of mixing minus its extra per-token cost (s/token, rhs − lhs of the "
                        "crossover inequality): above 0 favours MB, below 0 favours EB. Switches use hysteresis around 0.",
                        [Target(f"max by (replica) ({metric('ebplus_crossover_margin')})", by_replica)],
                        unit="s",
                    ),
                    Panel(
                        "Observed concurrency",
                        "EMA of running + waiting requests per replica: the N the throughput model is evaluated at.",
                        [Target(f"max by (replica) ({metric('ebplus_concurrency_observed')})", by_replica)],
                    ),
                    Panel(
                        "Thresholds not yet applied",
                        "Published threshold version minus the version the replica reports applied: 0 when every "
                        "replica runs the controller's latest decision.",
                        [
                            Target(
                                f"max by (replica) ({metric('ebplus_threshold_version')}) - "
                                f"max by (replica) ({metric('ebplus_applied_version')})",
                                by_replica,
                            )
                        ],
                    ),
                    Panel(
                        "KV back-offs per second",
                        "Prefill phases ended early for lack of KV blocks (EB scheduler), per replica.",
                        [Target(f"sum by (replica) (rate({metric('ebplus_kv_backoffs_total')}[{RATE}]))", by_replica)],
                        unit="ops",
                    ),
                ],
            ),
            Row(
                "Workload estimate (fleet)",
                [
                    Panel(
                        "p̂0: hazard of output lengths at t=0",
                        "Estimated probability per token that a request finishes at its first token (1/token); "
                        "≈ 1/μ_O for memoryless outputs.",
                        [Target(f"max({metric('ebplus_workload_p0')})", "p̂0")],
                        decimals=6,
                    ),
                    Panel(
                        "η̂: hazard slope",
                        "Estimated growth of the finishing hazard per token (1/token²). Above 0 means outputs are "
                        "more regular than memoryless, which raises θ* by Δθ.",
                        [Target(f"max({metric('ebplus_workload_eta')})", "η̂")],
                        decimals=9,
                    ),
                    Panel(
                        "μ̂_L and μ̂_O: mean input and output length",
                        "Means of the sliding windows of input lengths (W_L) and output lengths (W_O), tokens.",
                        [
                            Target(f"max({metric('ebplus_workload_mu_l_tokens')})", "μ̂_L (input)"),
                            Target(f"max({metric('ebplus_workload_mu_o_tokens')})", "μ̂_O (output)"),
                        ],
                    ),
                    Panel(
                        "Samples in the estimation window",
                        "Output lengths held in W_O (no estimate before the configured minimum).",
                        [Target(f"max({metric('ebplus_workload_samples')})", "samples")],
                    ),
                ],
            ),
            Row(
                "Controller health",
                [
                    Panel(
                        "Controller update latency",
                        "Time of one re-estimation and re-plan of the whole fleet, p50 and p99 (target: under 2 ms).",
                        [
                            Target(quantile(0.5, "ebplus_controller_update_seconds"), "p50"),
                            Target(quantile(0.99, "ebplus_controller_update_seconds"), "p99"),
                        ],
                        unit="s",
                    ),
                    Panel(
                        "Re-estimations per minute",
                        "Controller updates (one every update_every completions, plus overrides and manual recomputes), "
                        "and replica re-plans that failed (the replica kept its plan; anything above 0 is a bug: "
                        "see the controller log).",
                        [
                            Target(f"60 * sum(rate({metric('ebplus_controller_updates_total')}[{RATE}]))", "updates/min"),
                            Target(
                                f"60 * sum(rate({metric('ebplus_controller_plan_errors_total')}[{RATE}]))",
                                "failed re-plans/min",
                            ),
                        ],
                    ),
                    Panel(
                        "Telemetry received",
                        "Records the controller accepted per second: completions, steps, batches, aborted.",
                        [
                            Target(
                                f"sum by (kind) (rate({metric('ebplus_telemetry_received_total')}[{RATE}]))", "{{kind}}"
                            )
                        ],
                        unit="ops",
                    ),
                    Panel(
                        "Telemetry rejected",
                        "Records the controller rejected per second, by reason (bad types, non-finite values, unknown "
                        "replica...). Anything above 0 points at a replica bug or version skew.",
                        [
                            Target(
                                f"sum by (reason) (rate({metric('ebplus_telemetry_rejected_total')}[{RATE}]))",
                                "{{reason}}",
                            )
                        ],
                        unit="ops",
                    ),
                    Panel(
                        "Telemetry dropped by replicas",
                        "Records replicas dropped because their buffer was full (per second, by kind).",
                        [
                            Target(
                                f"sum by (replica, kind) (rate({metric('ebplus_telemetry_dropped_total')}[{RATE}]))",
                                "{{replica}} {{kind}}",
                            )
                        ],
                        unit="ops",
                    ),
                    Panel(
                        "Overrides active",
                        "Operator overrides (PUT /admin/overrides) in force; while one is, the controller's own "
                        "decision is not applied to the replicas it pins.",
                        [Target(f"max({metric('ebplus_overrides_active')})", "overrides")],
                        kind="stat",
                        width=6,
                    ),
                    Panel(
                        "Controller up / replicas known",
                        "1 if the controller actor answered the last scrape; replicas registered with it.",
                        [
                            Target(f"min({metric('ebplus_controller_up')})", "up"),
                            Target(f"max({metric('ebplus_replicas')})", "replicas"),
                        ],
                        kind="stat",
                        width=6,
                    ),
                ],
            ),
            Row(
                "Cost model (per replica)",
                [
                    Panel(
                        "Fixed step cost α by step kind",
                        "Fitted fixed cost of a prefill, decode and mixed step (seconds), per replica.",
                        [
                            Target(
                                f"max by (replica, kind) ({metric('ebplus_cost_alpha_seconds')})",
                                "{{replica}} {{kind}}",
                            )
                        ],
                        unit="s",
                    ),
                    Panel(
                        "Per-token cost β by step kind",
                        "Fitted cost per token of prefill and decode steps (seconds/token), per replica.",
                        [
                            Target(
                                f"max by (replica, kind) ({metric('ebplus_cost_beta_seconds')})", "{{replica}} {{kind}}"
                            )
                        ],
                        unit="s",
                    ),
                ],
            ),
        ],
    )


def serving() -> Dashboard:
    vllm = "{{model_name}}"
    return Dashboard(
        uid="ebplus-serving",
        title="EB+ serving",
        description="Traffic, latency and engine state of the vLLM replicas (vLLM and Ray Serve metrics), "
        "with EB+'s step times.",
        file="ebplus-serving.json",
        variables=[
            _datasource_var(),
            _query_var("model", "Model", "label_values(ray_vllm_num_requests_running, model_name)"),
            _query_var(
                "vllm_replica",
                "Serve replica",
                'label_values(ray_vllm_num_requests_running{model_name=~"$model"}, ReplicaId)',
            ),
            _query_var("replica", "EB+ replica", 'label_values(ebplus_step_seconds_count{model=~"$model"}, replica)'),
        ],
        rows=[
            Row(
                "Traffic",
                [
                    Panel(
                        "Request throughput",
                        "Requests finished per second by the engines, by finish reason (stop, length, abort).",
                        [
                            Target(
                                f"sum by (finished_reason) (rate({metric('ray_vllm_request_success_total')}[{RATE}]))",
                                "{{finished_reason}}",
                            )
                        ],
                        unit="reqps",
                    ),
                    Panel(
                        "Token throughput",
                        "Prompt (prefill) and generated (decode) tokens per second, summed over replicas.",
                        [
                            Target(f"sum(rate({metric('ray_vllm_prompt_tokens_total')}[{RATE}]))", "prompt"),
                            Target(f"sum(rate({metric('ray_vllm_generation_tokens_total')}[{RATE}]))", "generated"),
                        ],
                        unit="short",
                    ),
                    Panel(
                        "HTTP requests by status",
                        "Requests per second through the Serve HTTP proxies (OpenAI API, /admin, /metrics, /health), "
                        "by status code. 503 with Retry-After is the back-pressure answer when queues are full.",
                        [
                            Target(
                                f"sum by (status_code) (rate({metric('ray_serve_num_http_requests_total')}[{RATE}]))",
                                "{{status_code}}",
                            )
                        ],
                        unit="reqps",
                    ),
                    Panel(
                        "HTTP latency at the proxy",
                        "End-to-end latency of HTTP requests at the Serve proxy, p50 and p99 (ms).",
                        [
                            Target(quantile(0.5, "ray_serve_http_request_latency_ms"), "p50"),
                            Target(quantile(0.99, "ray_serve_http_request_latency_ms"), "p99"),
                        ],
                        unit="ms",
                    ),
                ],
            ),
            Row(
                "Latency",
                [
                    Panel(
                        "Time to first token (TTFT)",
                        "From arrival to the first generated token, p50 and p99 per model.",
                        [
                            Target(quantile(0.5, "ray_vllm_time_to_first_token_seconds", "model_name"), f"p50 {vllm}"),
                            Target(quantile(0.99, "ray_vllm_time_to_first_token_seconds", "model_name"), f"p99 {vllm}"),
                        ],
                        unit="s",
                    ),
                    Panel(
                        "Time per output token (TPOT) and inter-token latency (ITL)",
                        "TPOT: a request's decode time divided by its output tokens; ITL: the gap between consecutive "
                        "tokens. p50 and p99.",
                        [
                            Target(quantile(0.5, "ray_vllm_request_time_per_output_token_seconds"), "TPOT p50"),
                            Target(quantile(0.99, "ray_vllm_request_time_per_output_token_seconds"), "TPOT p99"),
                            Target(quantile(0.5, "ray_vllm_inter_token_latency_seconds"), "ITL p50"),
                            Target(quantile(0.99, "ray_vllm_inter_token_latency_seconds"), "ITL p99"),
                        ],
                        unit="s",
                    ),
                    Panel(
                        "End-to-end request latency",
                        "From arrival to the last token in the engine, p50 and p99.",
                        [
                            Target(quantile(0.5, "ray_vllm_e2e_request_latency_seconds"), "p50"),
                            Target(quantile(0.99, "ray_vllm_e2e_request_latency_seconds"), "p99"),
                        ],
                        unit="s",
                    ),
                ],
            ),
            Row(
                "Engine state",
                [
                    Panel(
                        "Running and waiting requests",
                        "Requests in the running batch and in the waiting queue, per Serve replica. EB+ caps running "
                        "at N.",
                        [
                            Target(
                                f"sum by (ReplicaId) ({metric('ray_vllm_num_requests_running')})",
                                "running {{ReplicaId}}",
                            ),
                            Target(
                                f"sum by (ReplicaId) ({metric('ray_vllm_num_requests_waiting')})",
                                "waiting {{ReplicaId}}",
                            ),
                        ],
                    ),
                    Panel(
                        "KV cache usage",
                        "Fraction of the KV cache blocks in use, per Serve replica.",
                        [Target(f"max by (ReplicaId) ({metric('ray_vllm_kv_cache_usage_perc')})", "{{ReplicaId}}")],
                        unit="percentunit",
                    ),
                    Panel(
                        "Preemptions",
                        "Requests preempted for KV space per second (recomputed later), per Serve replica. EB+ aims "
                        "for none while N ≤ N*. vLLM exports its counter only after the first preemption, so "
                        "until then the panel shows 0.",
                        [
                            Target(
                                f"sum by (ReplicaId) (rate({metric('ray_vllm_num_preemptions_total')}[{RATE}]))"
                                " or on() vector(0)",
                                "{{ReplicaId}}",
                            )
                        ],
                        unit="ops",
                    ),
                    Panel(
                        "Step time by kind",
                        "Engine step time of prefill-only, decode-only and mixed steps, p50 and p99 (EB+ telemetry).",
                        [
                            Target(quantile(0.5, "ebplus_step_seconds", "kind"), "p50 {{kind}}"),
                            Target(quantile(0.99, "ebplus_step_seconds", "kind"), "p99 {{kind}}"),
                        ],
                        unit="s",
                    ),
                    Panel(
                        "Engine steps by phase",
                        "Engine steps per second by phase (prefill, decode, mixed, idle), summed over replicas.",
                        [Target(f"sum by (phase) (rate({metric('ebplus_steps_total')}[{RATE}]))", "{{phase}}")],
                        unit="ops",
                    ),
                ],
            ),
        ],
    )


DASHBOARDS = (control_plane, serving)


# -- JSON ------------------------------------------------------------------------


def _panel_json(p: Panel, pid: int, x: int, y: int) -> dict:
    defaults: dict = {"unit": p.unit, "mappings": p.mappings}
    if p.decimals is not None:
        defaults["decimals"] = p.decimals
    options: dict = {"tooltip": {"mode": "multi", "sort": "none"}}
    if p.kind in ("timeseries", "state-timeline"):
        options["legend"] = {"displayMode": "list", "placement": "bottom", "showLegend": True}
    if p.kind == "stat":
        options = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "textMode": "value_and_name",
            "colorMode": "none",
            "graphMode": "none",
        }
    return {
        "id": pid,
        "type": p.kind,
        "title": p.title,
        "description": p.description,
        "datasource": DS,
        "gridPos": {"h": 8, "w": p.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options,
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DS, "expr": t.expr, "legendFormat": t.legend or "__auto"}
            for i, t in enumerate(p.targets)
        ],
    }


def build(d: Dashboard) -> dict:
    panels: list[dict] = []
    pid, y = 1, 0
    for row in d.rows:
        panels.append(
            {
                "id": pid,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        pid, y, x = pid + 1, y + 1, 0
        for p in row.panels:
            if x + p.width > 24:
                x, y = 0, y + 8
            panels.append(_panel_json(p, pid, x, y))
            pid, x = pid + 1, x + p.width
        y += 8
    return {
        "uid": d.uid,
        "title": d.title,
        "description": d.description,
        "tags": ["ebplus", "vllm", "ray"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "annotations": {"list": []},
        "links": [],
        "templating": {"list": d.variables},
        "panels": panels,
    }


def render_json(d: Dashboard) -> str:
    return json.dumps(build(d), indent=2, ensure_ascii=False) + "\n"


def render_readme(dashboards: list[Dashboard]) -> str:
    """The README's Observability section: what each panel shows, and from which metrics."""
    lines = [
        "## Observability",
        "",
        "<!-- generated by `python -m ebplus.dashboards.generate` from dashboards/generate.py; do not edit by hand -->",
        "",
        "Two Grafana dashboards ship in `dashboards/` (and, through the Helm chart, as a ConfigMap with the",
        'Grafana sidecar label `grafana_dashboard: "1"`). Both take the Prometheus data source as the variable',
        "`$datasource` and filter on `$model` and the replica variables; they are generated from code, so every",
        "metric they query is one the app exports (`ebplus_*`, listed in `controller/exporter.py`) or one of the",
        "vLLM / Ray Serve metrics listed in `dashboards/external.py`. Prometheus scrapes the app's `/metrics`",
        "(port 8000; `ebplus_*`, rendered from the controller's snapshot) and Ray's metrics port on every Ray node",
        "(8080 by default; `ray_vllm_*` engine metrics and `ray_serve_*` proxy metrics).",
        "",
    ]
    for d in dashboards:
        lines += [f"### {d.title}", "", d.description, ""]
        for row in d.rows:
            lines += [f"#### {row.title}", ""]
            for p in row.panels:
                names = sorted({base_name(n, HISTOGRAMS) for t in p.targets for n in metric_names(t.expr)})
                title = p.title.replace("*", "\\*")
                lines.append(f"- **{title}** — {p.description} (`{'`, `'.join(names)}`)")
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def outputs() -> dict[Path, str]:
    """Every generated file and its content."""
    dashboards = [make() for make in DASHBOARDS]
    files: dict[Path, str] = {}
    for d in dashboards:
        text = render_json(d)
        for out in OUT_DIRS:
            files[out / d.file] = text
    files[README_SECTION] = render_readme(dashboards)
    return files


def outputs_paths() -> list[Path]:
    return list(outputs())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a committed file is stale")
    args = parser.parse_args(argv)
    stale = []
    for path, text in outputs().items():
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    generated = {p for p in outputs_paths()}
    for out in OUT_DIRS:
        for path in sorted(out.glob("*.json")):
            if path in generated:
                continue
            if args.check:
                stale.append(path)
            else:
                path.unlink()
                print(f"removed {path.relative_to(ROOT)}")
    if stale:
        print(
            "stale: " + ", ".join(str(p.relative_to(ROOT)) for p in stale) + "; run `python -m ebplus.dashboards.generate`",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
