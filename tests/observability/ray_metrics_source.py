"""Run a local Ray whose metrics agent exports vLLM's and Ray Serve's metrics, the way they do in a deployment.

    python ray_metrics_source.py METRICS_PORT SPECS REPLICA_ID   # prints READY, serves until stdin closes

An actor declares every vLLM metric of ``dashboards.external`` through vLLM's own Ray
wrappers (``vllm.v1.metrics.ray_wrappers``, what ``RayPrometheusStatLogger`` uses under
``ray.serve.llm``) with the names and kinds vLLM declares, and records Ray Serve's HTTP
metrics through Ray Serve's own ``RequestIngressMetrics`` (what the proxy uses). Values
are synthetic; names, types, labels and the export path are the real ones. Outside a
Serve replica vLLM's wrappers tag ``ReplicaId=""``; the emitter stands in for the Serve
replica ``REPLICA_ID`` (vLLM reads the id from the replica context, as EB+ does), so the
dashboards' replica filter is exercised on engine metrics too.
"""

from __future__ import annotations

import sys

import ray


@ray.remote(num_cpus=0)
class Emitter:
    def __init__(self, specs: list[tuple[str, str, list[str]]], replica_id: str) -> None:
        from ray.serve._private.common import RequestProtocol
        from ray.serve._private.request_ingress_metrics import RequestIngressMetrics
        from vllm.v1.metrics import ray_wrappers
        from vllm.v1.metrics.ray_wrappers import RayCounterWrapper, RayGaugeWrapper, RayHistogramWrapper

        ray_wrappers._get_replica_id = lambda: replica_id  # what a Serve replica's context answers

        self.metrics = []
        for source, kind, extra in specs:
            labelnames = ["model_name", "engine", *extra]
            if kind == "gauge":
                m = RayGaugeWrapper(name=source, documentation="", labelnames=labelnames)
            elif kind == "counter":
                m = RayCounterWrapper(name=source, documentation="", labelnames=labelnames)
            else:
                m = RayHistogramWrapper(
                    name=source, documentation="", labelnames=labelnames, buckets=[0.01, 0.1, 1, 10]
                )
            self.metrics.append((kind, m.labels("synthetic-model", "0", *(["stop"] * len(extra)))))
        self.http = RequestIngressMetrics(
            RequestProtocol.HTTP, source="proxy", node_id="n0", node_ip_address="127.0.0.1"
        )
        self.n = 0

    def tick(self) -> int:
        self.n += 1
        for kind, m in self.metrics:
            if kind == "gauge":
                m.set(0.25 + (self.n % 4) / 10)
            elif kind == "counter":
                m.inc(1 + self.n % 3)
            else:
                m.observe(0.05 * (1 + self.n % 5))
        self.http.record_request(
            route="/v1", method="POST", application="ebplus", status_code="200",
            latency_ms=20.0 + self.n % 7, is_error=False, deployment_name="LLMServer",
        )  # fmt: skip
        return self.n


def main() -> None:
    import json
    import select

    port = int(sys.argv[1])
    specs = json.loads(sys.argv[2])
    ray.init(
        num_cpus=1,
        include_dashboard=False,
        namespace="ebplus-metrics-test",
        _metrics_export_port=port,
        _system_config={"metrics_report_interval_ms": 1000},
        log_to_driver=False,
    )
    emitter = Emitter.remote(specs, sys.argv[3])
    ray.get(emitter.tick.remote())
    print("READY", flush=True)
    try:
        while True:
            ready, _, _ = select.select([sys.stdin], [], [], 0.5)
            if ready and not sys.stdin.readline():
                break
            ray.get(emitter.tick.remote())
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
