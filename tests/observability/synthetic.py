"""A live ``/metrics`` endpoint of the real exporter over a FleetController fed synthetic telemetry.

:class:`SyntheticApp` runs ``controller.exporter.render(FleetController.snapshot(), model)``
behind a loopback HTTP server, exactly what the app's ingress serves on ``/metrics``, and
keeps feeding the controller telemetry batches (completions, steps of every kind, engine
counters) from two replicas, so counters move and histograms fill while Prometheus scrapes.

``SyntheticApp(replicas=("vllm-a",), plugin=True)`` is one plain ``vllm serve`` with the
ebplus plugin instead: one replica, and the same ``/metrics`` also carries vLLM's own
``vllm:*`` engine metrics and its API server's ``http_*`` metrics, declared with the names,
kinds and labels of ``dashboards.external``'s plugin-mode entries (which
``test_external_metrics.py`` checks against the installed vLLM) through prometheus-client,
the library vLLM exports them with.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from docgen.dashboards.external import EXTERNAL_METRICS
from ebplus.controller.cost_model import CostModel
from ebplus.controller.exporter import render
from ebplus.controller.fleet import FleetController
from ebplus.controller.messages import (
    CompletionRecord,
    EngineFacts,
    EngineStats,
    FinishReason,
    Mode,
    Registration,
    StepRecord,
    TelemetryBatch,
    encode,
)

H200 = CostModel(
    alpha_p=1.2786e-3, beta_p=2.4853e-5, alpha_d=8.921e-3, beta_d=4.586e-5, beta_mb=(2.494e-5, 5.193e-5, 1.478e-5)
)
MODEL = "synthetic-model"
REPLICAS = ("replica-a", "replica-b")


class PluginEngineMetrics:
    """vLLM's plugin-mode metrics (``vllm:*``, ``http_*``) in a registry of their own, moved by :meth:`tick`."""

    def __init__(self, model: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.children: list[tuple[str, object]] = []
        classes = {"gauge": Gauge, "counter": Counter, "histogram": Histogram}
        for m in (m for m in EXTERNAL_METRICS if m.mode == "plugin"):
            values = {"model_name": model, "engine": "0", "finished_reason": "stop",
                      "handler": "/v1/chat/completions", "method": "POST", "status": "2xx"}  # fmt: skip
            name = m.name.removesuffix("_total") if m.kind == "counter" else m.name
            kwargs = {"buckets": (0.01, 0.1, 1, 10)} if m.kind == "histogram" else {}
            family = classes[m.kind](name, m.help, list(m.labels), registry=self.registry, **kwargs)
            self.children.append(
                (m.kind, family.labels(*(values[label] for label in m.labels)) if m.labels else family)
            )
        self.n = 0

    def tick(self) -> None:
        self.n += 1
        for kind, child in self.children:
            if kind == "gauge":
                child.set(0.25 + (self.n % 4) / 10)
            elif kind == "counter":
                child.inc(1 + self.n % 3)
            else:
                child.observe(0.05 * (1 + self.n % 5))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class SyntheticApp:
    """Context manager: ``with SyntheticApp() as app: app.address  # "127.0.0.1:PORT"``."""

    def __init__(
        self,
        model: str = MODEL,
        interval_s: float = 0.1,
        seed: int = 0,
        replicas: tuple[str, ...] = REPLICAS,
        plugin: bool = False,
    ) -> None:
        self.model = model
        self.replicas = replicas
        self.engine = PluginEngineMetrics(model) if plugin else None
        self.interval_s = interval_s
        self.rng = np.random.default_rng(seed)
        self.fleet = FleetController()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.stats = {r: {"steps_prefill": 0, "steps_decode": 0, "steps_mixed": 0, "steps_idle": 0,
                          "phase_switches": 0, "preemptions": 0, "kv_backoffs": 0} for r in replicas}  # fmt: skip
        for rid in replicas:
            facts = EngineFacts(kv_capacity_tokens=2_000_000, max_num_seqs=1024, device="NVIDIA H200")
            self.fleet.register(Registration(replica_id=rid, mode=Mode.AUTO, facts=facts, prior=H200))
        for _ in range(4):  # past min_samples and a few re-estimations: every estimate exists from the start
            self.feed()
        self.fleet.set_override(replicas[-1], k=9, ttl_s=3600)
        bad = CompletionRecord(-1, 3, FinishReason.STOP)
        self.fleet.ingest(encode(TelemetryBatch(replica_id=replicas[0], completions=[bad])))  # one rejected record

        app = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                with app.lock:
                    body = render(app.fleet.snapshot(), app.model)
                    if app.engine is not None:
                        body += app.engine.render()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.threads = [
            threading.Thread(target=self.server.serve_forever, daemon=True),
            threading.Thread(target=self._feed_forever, daemon=True),
        ]

    @property
    def address(self) -> str:
        host, port = self.server.server_address[:2]
        return f"{host}:{port}"

    def feed(self) -> None:
        """One telemetry batch per replica: 50 completions and steps of every kind."""
        with self.lock:
            if self.engine is not None:
                self.engine.tick()
            for rid in self.replicas:
                outs = self.rng.geometric(1 / 200, 50)
                comps = tuple(
                    CompletionRecord(int(self.rng.integers(256, 768)), int(o), FinishReason.STOP) for o in outs
                )
                steps = (
                    tuple(
                        StepRecord(int(self.rng.integers(1024, 4096)), 0, 300, 900, float(self.rng.uniform(0.05, 0.1)))
                        for _ in range(5)
                    )
                    + tuple(
                        StepRecord(0, int(self.rng.integers(600, 1000)), 900, 300, float(self.rng.uniform(0.04, 0.06)))
                        for _ in range(20)
                    )
                    + (StepRecord(64, 512, 576, 40, float(self.rng.uniform(0.02, 0.04))),)
                )
                s = self.stats[rid]
                s["steps_prefill"] += 5
                s["steps_decode"] += 20
                s["steps_mixed"] += 1
                s["phase_switches"] += 2
                s["preemptions"] += int(self.rng.integers(0, 2))
                s["kv_backoffs"] += int(self.rng.integers(0, 2))
                batch = TelemetryBatch(
                    replica_id=rid,
                    completions=list(comps),
                    steps=list(steps),
                    applied_version=self.fleet.version,
                    stats=EngineStats(**s),
                )
                self.fleet.ingest(encode(batch))

    def _feed_forever(self) -> None:
        while not self.stop.wait(self.interval_s):
            self.feed()

    def __enter__(self) -> SyntheticApp:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()
