"""The Ray Serve application: ingress + EB+ vLLM replicas + the controller actor.

``build_app(args)`` is a Ray Serve application builder: ``ebplus serve`` calls it
locally and KubeRay's ``serveConfigV2`` names it (``import_path:
ebplus.deploy.app:build_app``) with the same mapping as ``args``, validated by
:class:`ebplus.deploy.config.ServeConfig`.

It follows Ray Serve LLM's convention: an ``LLMConfig`` whose ``engine_kwargs``
select our scheduler (``scheduler_cls``), deployed with
``build_llm_deployment`` using our ``LLMServer`` subclass, behind the OpenAI
ingress.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ebplus.deploy import sources
from ebplus.deploy.config import ServeConfig, parse_config
from ebplus.deploy.priority import ingress_env
from ebplus.replicas import settings
from ebplus.replicas.settings import SCHEDULER_CLS

APP_NAME = "ebplus"


def model_path(cfg: ServeConfig, build: bool = False) -> str:
    """Filesystem path of the model; builtin models are built when ``build`` is set."""
    source = cfg.model.source
    if not source.startswith("builtin:"):
        return sources.parse(source).for_vllm()  # a Hub id (hf:// dropped) or an absolute directory
    from ebplus.deploy import models

    name, cache = builtin_spec(cfg)
    if build:
        return str(models.build_builtin(name, cache, log=models.log_line))
    return str(models.builtin_dir(name, cache))


def builtin_spec(cfg: ServeConfig) -> tuple[str, Path]:
    """``(name, absolute cache directory)`` of a builtin ``model.source``.

    A relative ``cache_dir`` is resolved against the working directory of the
    process that builds the application, once, so the replicas build where the
    application said, whatever their own working directory.
    """
    return cfg.model.source.removeprefix("builtin:"), Path(cfg.model.cache_dir).expanduser().resolve()


def request_limits(cfg: ServeConfig) -> dict[str, str]:
    """vLLM's per-request fan-out limits, for the ingress (which parses requests) and the replicas.

    vLLM accepts ``n`` (choices per prompt) up to 16,384 and 1,024 prompts per
    completion request by default: one request could ask a replica for millions of
    sequences. Neither can usefully exceed the sequences the engine runs at once.
    """
    cap = str(cfg.engine.max_num_seqs)
    return {"VLLM_MAX_N_SEQUENCES": cap, "VLLM_MAX_COMPLETION_PROMPTS": cap}


def engine_env(cfg: ServeConfig) -> dict[str, str]:
    """Environment of the replica processes: vLLM's start-up settings (ours travel in ``additional_config``)."""
    env = request_limits(cfg)
    if cfg.engine.cpu_kv_cache_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = f"{cfg.engine.cpu_kv_cache_gib:g}"
    # NOTE: secrets (auth.*_env) are not copied here: each process reads its own
    # environment, so tokens never travel inside the application's definition.
    return env


def engine_kwargs(cfg: ServeConfig) -> dict[str, Any]:
    """vLLM engine arguments of a replica: the config's, our scheduler, and its settings."""
    sections = {"scheduler": cfg.scheduler, "controller": cfg.controller}
    # Ray Serve LLM leaves enable_lora to the user; a model with adapters needs it, so it is implied
    lora = {"enable_lora": True} if cfg.model.lora is not None else {}
    return {
        **lora,
        **cfg.engine.engine_kwargs(),
        "scheduler_cls": SCHEDULER_CLS,
        "additional_config": settings.additional_config(sections),
    }


def llm_config(cfg: ServeConfig, model_source: str) -> Any:
    """The Ray Serve LLM ``LLMConfig`` of the replicas."""
    from ray.serve.llm import LLMConfig

    rep = cfg.replicas
    kwargs: dict[str, Any] = {
        "model_loading_config": {"model_id": cfg.model.id, "model_source": model_source},
        "engine_kwargs": engine_kwargs(cfg),
        "deployment_config": rep.deployment_options(cfg.model.id),
        "runtime_env": {**rep.runtime_env, "env_vars": {**rep.runtime_env.get("env_vars", {}), **engine_env(cfg)}},
        "log_engine_metrics": True,
    }
    if rep.accelerator == "cpu":
        kwargs["accelerator_config"] = {"kind": "cpu"}
        # NOTE: a CPU engine streams each request a few tokens a second, so Ray Serve LLM's
        # 50 ms stream batching sends one token per batch anyway and adds a timer per stream;
        # sending each token as it comes costs the replicas less CPU (docs/benchmarks/overhead.md).
        kwargs["experimental_configs"] = {"stream_batching_interval_ms": 0}
    elif rep.accelerator_type is not None:
        kwargs["accelerator_type"] = rep.accelerator_type
    if rep.placement_group_config is not None:
        kwargs["placement_group_config"] = rep.placement_group_config
    if cfg.model.lora is not None:
        from ebplus.replicas.lora import ray_lora_config

        kwargs["lora_config"] = ray_lora_config(cfg.model.lora.model_dump())
    return LLMConfig(**kwargs)


def start_controller_for(cfg: ServeConfig):
    """Create, find or upgrade (code or ``controller:`` config changed) the controller actor this deployment reports to."""
    from ebplus.controller.lifecycle import ensure_controller

    return ensure_controller(cfg.controller)


def replica_builds(models: Iterable[ServeConfig], built: Mapping[str, str]) -> dict[str, Callable[[], Path]]:
    """Model id -> the build each replica runs first, for each builtin model nobody built yet.

    ``ebplus serve`` builds builtins before it builds the application (``built``: their
    paths). KubeRay runs this builder on the head, and the replicas on other pods, so a
    builtin nobody built is built by each replica on its own node before its engine starts
    (idempotent and locked: replicas of one node build it once). The replica gets a
    callable, not this module: the replica package sits below the deployment's.
    """
    from ebplus.deploy import models as builders

    return {
        m.model.id: functools.partial(builders.build_builtin, *builtin_spec(m), log=builders.log_line)
        for m in models
        if m.model.id not in built and m.model.source.startswith("builtin:")
    }


def model_paths(cfg: ServeConfig, build: bool = False) -> dict[str, str]:
    """:func:`model_path` of every model of the deployment, by model id."""
    return {model.model.id: model_path(model, build) for model in cfg.models()}


def build(cfg: ServeConfig, model_sources: Mapping[str, str] | None = None):
    """The Serve application for a validated config: one replica deployment per model, each replica
    with its EB+ scheduler, all behind one OpenAI ingress (routed by the request's ``model``) and
    reporting to the one controller (``cfg``'s ``controller:`` section)."""
    from ray import serve
    from ray.llm._internal.serve.core.configs.openai_api_models import to_model_metadata
    from ray.serve.llm import build_llm_deployment

    from ebplus.deploy.ingress import EBPlusIngress, ingress_class
    from ebplus.replicas.server import EBPlusServer

    # NOTE: to_model_metadata (the /v1/models card of an LLMConfig) is private in ray 2.60: the public
    # ray.serve.llm.build_openai_app calls it internally but cannot bind our replica settings or ingress.

    start_controller_for(cfg)
    models = cfg.models()
    board_routers = any(m.replicas.routing.uses_board for m in models)
    if board_routers:
        from ebplus.replicas.board import ensure_board

        ensure_board()
    sources = dict(model_sources or {})
    llms = {m.model.id: llm_config(m, sources.get(m.model.id) or model_path(m)) for m in models}
    unbuilt = replica_builds(models, sources)
    replicas = {
        m.model.id: build_llm_deployment(
            llms[m.model.id],
            deployment_cls=EBPlusServer,
            bind_kwargs={"replicas": m.replicas, "mode": m.scheduler.mode, "prepare_model": unbuilt.get(m.model.id)},
        )
        for m in models
    }
    auth = cfg.auth
    # the ingress parses every model's requests: the largest model's fan-out limits (each replica has its own)
    limits = max((request_limits(m) for m in models), key=lambda env: int(env["VLLM_MAX_N_SEQUENCES"]))
    priority = ingress_env(cfg.http.ingress_niceness, cfg.http.router_niceness, board_routers)
    options = EBPlusIngress.get_deployment_options(list(llms.values()))
    options.update(
        name="EBPlusIngress",
        num_replicas=cfg.http.ingress_replicas,
        ray_actor_options={
            "num_cpus": cfg.http.ingress_num_cpus,
            "resources": dict(cfg.http.ingress_resources),
            "runtime_env": {"env_vars": {**limits, **priority}},
        },
    )
    options.pop("autoscaling_config", None)
    ingress = serve.deployment(ingress_class(cfg.http.max_body_bytes, auth, cfg.http.cors_allow_origins), **options)
    return ingress.bind(
        llm_deployments=replicas,
        model_cards={model_id: to_model_metadata(model_id, llm) for model_id, llm in llms.items()},
        lora_paths={m.model.id: m.model.lora.dynamic_lora_loading_path for m in models if m.model.lora is not None},
        auth=auth,
        model_id=cfg.model.id,
        # a replica heartbeats every fifth of its own stall_timeout_s: the longest one is safe for all
        stall_timeout_s=max(m.replicas.stall_timeout_s for m in models),
        progress_timeout_s=_longest(m.replicas.progress_timeout_s for m in models),
        read_deadline_s=cfg.http.read_deadline_s,
    )


def _longest(values: Iterable[float | None]) -> float | None:
    """The most lenient of the models' deadlines (``None``, no deadline, if any model has none)."""
    values = list(values)
    return None if any(v is None for v in values) else max(v for v in values if v is not None)


def build_app(args: dict) -> Any:
    """Ray Serve application builder (``import_path: ebplus.deploy.app:build_app``)."""
    return build(parse_config(args, "application args"))
