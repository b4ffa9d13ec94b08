"""The "EB+ serving" dashboard: traffic, latency and engine state of the vLLM replicas, with EB+'s step times.

Every engine query reads both deployments (:func:`~docgen.dashboards.grafana.engine`): Ray Serve LLM's
``ray_vllm_*`` and plain vLLM's ``vllm:*`` (plugin mode). A per-mode choice (a ``$prefix`` variable the
user sets) would show "No data" until set right and cannot show a fleet that runs both; the union costs
one ``or`` per query, and each side is empty in the other deployment.
"""

from __future__ import annotations

from docgen.dashboards.grafana import (
    RATE,
    Dashboard,
    Panel,
    Row,
    Target,
    datasource_var,
    engine,
    metric,
    on_ebplus_targets,
    quantile,
    replica_vars,
)


def _http_quantile(q: float) -> str:
    """The proxy's latency quantile (ms): Ray Serve's, or vLLM's API server's (seconds, times 1000)."""
    ray = quantile(q, "ray_serve_http_request_latency_ms")
    plugin = on_ebplus_targets(f"rate({metric('http_request_duration_highr_seconds', '_bucket')}[{RATE}])")
    return f"{ray} or 1000 * histogram_quantile({q}, sum by (le) ({plugin}))"


def dashboard() -> Dashboard:
    """Traffic, latency and engine state from vLLM's and Ray Serve's metrics, plus EB+'s step timings."""
    vllm = "{{model_name}}"
    return Dashboard(
        uid="ebplus-serving",
        title="EB+ serving",
        description="Traffic, latency and engine state of the vLLM replicas (vLLM and Ray Serve metrics, under "
        "Ray Serve LLM or plain vLLM with the ebplus plugin), with EB+'s step times.",
        file="ebplus-serving.json",
        variables=[
            datasource_var(),
            *replica_vars(),
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
                                f"sum by (finished_reason) {engine('ray_vllm_request_success_total', rate=True)}",
                                "{{finished_reason}}",
                            )
                        ],
                        unit="reqps",
                    ),
                    Panel(
                        "Token throughput",
                        "Prompt (prefill) and generated (decode) tokens per second, summed over replicas.",
                        [
                            Target(f"sum {engine('ray_vllm_prompt_tokens_total', rate=True)}", "prompt"),
                            Target(f"sum {engine('ray_vllm_generation_tokens_total', rate=True)}", "generated"),
                        ],
                        unit="short",
                    ),
                    Panel(
                        "HTTP requests by status",
                        "Requests per second through the Serve HTTP proxies (OpenAI API, /admin, /metrics, /health), "
                        "by status code; with plain vLLM, through its API server, by status class (2xx, 4xx...). "
                        "503 with Retry-After is the back-pressure answer when queues are full.",
                        [
                            Target(
                                f"sum by (status_code) (rate({metric('ray_serve_num_http_requests_total')}[{RATE}])) "
                                "or sum by (status) ("
                                + on_ebplus_targets(f"rate({metric('http_requests_total')}[{RATE}])")
                                + ")",
                                "{{status_code}}{{status}}",
                            )
                        ],
                        unit="reqps",
                    ),
                    Panel(
                        "HTTP latency at the proxy",
                        "End-to-end latency of HTTP requests at the Serve proxy (plain vLLM: its API server), "
                        "p50 and p99 (ms).",
                        [Target(_http_quantile(0.5), "p50"), Target(_http_quantile(0.99), "p99")],
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
                        "Requests in the running batch and in the waiting queue, per replica. EB+ caps running at N.",
                        [
                            Target(
                                f"sum by (ReplicaId) {engine('ray_vllm_num_requests_running')}",
                                "running {{ReplicaId}}",
                            ),
                            Target(
                                f"sum by (ReplicaId) {engine('ray_vllm_num_requests_waiting')}",
                                "waiting {{ReplicaId}}",
                            ),
                        ],
                    ),
                    Panel(
                        "KV cache usage",
                        "Fraction of the KV cache blocks in use, per replica.",
                        [Target(f"max by (ReplicaId) {engine('ray_vllm_kv_cache_usage_perc')}", "{{ReplicaId}}")],
                        unit="percentunit",
                    ),
                    Panel(
                        "Preemptions",
                        "Requests preempted for KV space per second (recomputed later), per replica. EB+ aims "
                        "for none while N ≤ N*. vLLM exports its counter only after the first preemption, so "
                        "until then the panel shows 0.",
                        [
                            Target(
                                f"sum by (ReplicaId) {engine('ray_vllm_num_preemptions_total', rate=True)}"
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
