"""Ray Serve LLM's stock OpenAI app on a deployment config's engine: the baseline (b) of the overhead benchmark.

    python -m benchmarks.ray_llm_app [--config deploy/local.yaml] [--port 8000]

What a Ray Serve LLM user writes: one ``LLMConfig`` (model, the config's vLLM engine
arguments, no ``scheduler_cls``) and ``ray.serve.llm.build_openai_app`` with its
default ingress, on a Ray cluster started exactly as ``ebplus serve`` starts it
(:func:`ebplus.deploy.cli.start_ray`). The only settings beyond Ray Serve LLM's
defaults are the ones a 2-core CPU machine needs to schedule at all (fractional
CPUs for the replica and the ingress, from the config, as in ``ebplus serve``) and
the engine's environment (``VLLM_CPU_KVCACHE_SPACE``). Runs until SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path
from typing import Any

#: Printed once the app serves (the benchmark waits for it).
READY = "ray-llm app is up"
APP_NAME = "ray-llm"


def build(cfg: Any, model_source: str) -> Any:
    """The stock OpenAI app for the config's model and engine."""
    from ray.serve.llm import LLMConfig, build_openai_app

    from ebplus.deploy.app import engine_env

    llm: dict[str, Any] = {
        "model_loading_config": {"model_id": cfg.model.id, "model_source": model_source},
        "engine_kwargs": cfg.engine.engine_kwargs(),
        "deployment_config": {
            "num_replicas": cfg.replicas.num_replicas,
            "ray_actor_options": {"num_cpus": cfg.replicas.num_cpus},
        },
        "runtime_env": {"env_vars": engine_env(cfg)},
    }
    if cfg.replicas.accelerator == "cpu":
        llm["accelerator_config"] = {"kind": "cpu"}
    args: dict[str, Any] = {"llm_configs": [LLMConfig(**llm)]}
    if not _direct_streaming():  # with it the model replica is the ingress: there is no ingress deployment
        args["ingress_deployment_config"] = {"ray_actor_options": {"num_cpus": cfg.http.ingress_num_cpus}}
    return build_openai_app(args)


def _direct_streaming() -> bool:
    """Ray Serve LLM's ``RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING`` (read by Ray at import)."""
    from ray.llm._internal.serve.constants import RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING

    return RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.ray_llm_app", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--config", type=Path, default=Path("deploy/local.yaml"), help="deployment config (YAML)")
    parser.add_argument("--port", type=int, default=8000, help="HTTP port")
    parser.add_argument("--ray-metrics-port", type=int, default=None, help="override ray.metrics_export_port")
    args = parser.parse_args(argv)

    from ray import serve

    from ebplus.deploy.app import model_path
    from ebplus.deploy.cli import start_ray
    from ebplus.deploy.config import load_config

    cfg = load_config(args.config)
    cfg = cfg.model_copy(update={"http": cfg.http.model_copy(update={"host": "127.0.0.1", "port": args.port})})
    if args.ray_metrics_port is not None:
        cfg = cfg.model_copy(update={"ray": cfg.ray.model_copy(update={"metrics_export_port": args.ray_metrics_port})})
    source = model_path(cfg, build=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    import ray

    start_ray(cfg.ray)
    try:
        serve.start(http_options={"host": cfg.http.host, "port": cfg.http.port})
        serve.run(build(cfg, source), name=APP_NAME, route_prefix="/", blocking=False)
        print(f"{READY}: http://{cfg.http.host}:{cfg.http.port}/v1", flush=True)
        while not stop.wait(1.0):
            pass
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
