"""``ebplus serve`` and ``ebplus build-model``."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path

from ebplus.deploy.config import ConfigError, ServeConfig, load_config


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser(
        "serve",
        help="run the Ray Serve deployment from a config file",
        description=(
            "Start (or join) a Ray cluster, the EB+ controller actor and the Serve application "
            "(OpenAI API, /admin, /metrics) described by a config file, then wait until Ctrl-C or "
            "SIGTERM and shut down cleanly. Builtin models are built first if missing."
        ),
    )
    s.add_argument("--config", type=Path, default=Path("deploy/local.yaml"), help="deployment config (YAML)")
    s.add_argument("--port", type=int, default=None, help="override http.port")
    s.add_argument("--host", default=None, help="override http.host")
    s.add_argument("--check", action="store_true", help="validate the config and exit")
    s.set_defaults(run=run_serve)

    b = sub.add_parser(
        "build-model",
        help="build a bundled model directory (SmolLM2 or the tiny test model)",
        description="Build (idempotently) a builtin model directory and print its path.",
    )
    b.add_argument("name", choices=("smollm2", "tiny"), help="which builtin model")
    b.add_argument("--cache-dir", type=Path, default=Path("models"), help="where models are cached")
    b.set_defaults(run=run_build_model)


def run_build_model(args: argparse.Namespace) -> int:
    from ebplus.deploy import models

    builder = {"smollm2": models.build_smollm2, "tiny": models.build_tiny_llama}[args.name]
    path = builder(args.cache_dir.expanduser().resolve(), log=lambda msg: print(f"[build-model] {msg}", flush=True))
    print(path)
    return 0


def _with_overrides(cfg: ServeConfig, args: argparse.Namespace) -> ServeConfig:
    http = cfg.http.model_copy(
        update={k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    )
    return cfg.model_copy(update={"http": http})


def banner(cfg: ServeConfig, ray_address: str | None = None) -> str:
    host = "127.0.0.1" if cfg.http.host in ("0.0.0.0", "::") else cfg.http.host
    base = f"http://{host}:{cfg.http.port}"
    # NOTE: the exact GCS address, so a driver (tests, an operator's shell) attaches to
    # this cluster rather than to whichever Ray started last on the machine ("auto").
    cluster = [] if ray_address is None else [f"  Ray cluster  {ray_address}   (ray.init(address=...), namespace {cfg.ray.namespace!r})"]
    return "\n".join(
        [
            f"EB+ Serve is up: model {cfg.model.id!r}, {cfg.replicas.num_replicas} replica(s), mode {cfg.scheduler.mode.value}",
            f"  OpenAI API   {base}/v1",
            f"  admin        {base}/admin/thresholds   (mutations need Authorization: Bearer ${cfg.auth.admin_token_env})",
            f"  metrics      {base}/metrics",
            f"  Ray metrics  http://{host}:{cfg.ray.metrics_export_port}/metrics",
            *cluster,
            "  try:",
            f"    curl -s {base}/v1/chat/completions -H 'Content-Type: application/json' \\",
            f"      -d '{{\"model\": \"{cfg.model.id}\", \"messages\": [{{\"role\": \"user\", \"content\": \"What is the capital of France?\"}}], \"max_tokens\": 32}}'",
            "Ctrl-C stops it.",
        ]
    )


def start_ray(cfg: ServeConfig, attempts: int = 3) -> None:
    """Join ``ray.address`` or start a local Ray; retried because Ray gives a new
    node only 30 s to register, which a loaded 2-core machine can miss."""
    import ray

    for attempt in range(1, attempts + 1):
        try:
            if cfg.ray.address:
                ray.init(address=cfg.ray.address, namespace=cfg.ray.namespace, log_to_driver=False)
            else:
                ray.init(
                    num_cpus=cfg.ray.num_cpus,
                    namespace=cfg.ray.namespace,
                    include_dashboard=False,
                    log_to_driver=False,
                    _metrics_export_port=cfg.ray.metrics_export_port,
                )
            return
        except Exception as exc:  # Ray raises a bare Exception for a slow node start
            if attempt == attempts or "timed out during startup" not in str(exc):
                raise
            print(f"[serve] Ray start timed out ({exc}); retrying ({attempt}/{attempts - 1})", flush=True)
            ray.shutdown()


def run_serve(args: argparse.Namespace) -> int:
    try:
        cfg = _with_overrides(load_config(args.config), args)
    except ConfigError as exc:
        print(f"ebplus serve: {exc}", file=sys.stderr)
        return 2
    if args.check:
        print(f"{args.config}: ok")
        return 0

    from ebplus.deploy.app import APP_NAME, build, model_path

    print(f"[serve] model {cfg.model.source} ...", flush=True)
    source = model_path(cfg, build=True)

    import ray
    from ray import serve

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    print("[serve] starting Ray ...", flush=True)
    start_ray(cfg)
    try:
        serve.start(http_options={"host": cfg.http.host, "port": cfg.http.port})
        print("[serve] deploying (engine start-up takes a minute on CPU) ...", flush=True)
        started = time.monotonic()
        serve.run(build(cfg, model_source=source), name=APP_NAME, route_prefix="/", blocking=False)
        print(f"[serve] deployed in {time.monotonic() - started:.0f} s", flush=True)
        print(banner(cfg, ray.get_runtime_context().gcs_address), flush=True)
        while not stop.wait(1.0):
            pass
        print("[serve] shutting down ...", flush=True)
    finally:
        if cfg.ray.address:
            serve.delete(APP_NAME)  # a shared cluster keeps its other apps
        else:
            serve.shutdown()
        ray.shutdown()
    print("[serve] stopped", flush=True)
    return 0
