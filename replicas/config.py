"""The replica side's configuration: the vLLM engine, the EB+ scheduler, the Serve deployment.

Sections of the deployment config (:class:`ebplus.deploy.config.ServeConfig`);
:class:`SchedulerSection` is also what the scheduler itself reads from vLLM's
``--additional-config`` (see :mod:`ebplus.replicas.settings`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ebplus.controller import theory
from ebplus.controller.config import CustomResources
from ebplus.controller.messages import Mode, ThresholdUpdate
from ebplus.replicas.niceness import Setting as NicenessSetting
from ebplus.replicas.niceness import check_setting as check_niceness
from ebplus.replicas.sampling import Sampling

#: The replica variables EB+ Serve sets itself, by the key they come from.
RUNTIME_ENV_SET_BY = {
    "VLLM_CPU_KVCACHE_SPACE": "engine.cpu_kv_cache_gib",
    "VLLM_MAX_N_SEQUENCES": "engine.max_num_seqs",
    "VLLM_MAX_COMPLETION_PROMPTS": "engine.max_num_seqs",
}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


#: Where Ray Serve LLM downloads adapters from (its own loader); a local directory is read in place.
REMOTE_LORA_SCHEMES = ("s3://", "gs://", "abfss://", "azure://")
LORA_FILE_SCHEME = "file://"
#: The file that makes a folder an adapter (PEFT's, and Ray Serve LLM's ``LORA_ADAPTER_CONFIG_NAME``).
LORA_ADAPTER_CONFIG = "adapter_config.json"


class LoraSection(_Section):
    """The model's LoRA adapters, served as ``<model.id>:<adapter>`` (Ray Serve LLM's ``lora_config``, same keys)."""

    dynamic_lora_loading_path: str = Field(
        min_length=1,
        description=(
            "Where the adapters are, one folder per adapter (each with adapter_config.json): a local "
            "directory on every replica's node ('/models/adapters' or 'file:///models/adapters': a mounted "
            "volume), or an s3://, gs://, abfss:// or azure:// prefix that Ray Serve LLM downloads from."
        ),
    )
    max_num_adapters_per_replica: int = Field(
        16, gt=0, description="Adapters a replica keeps loaded (least recently used unloaded beyond)."
    )
    download_timeout_s: float | None = Field(
        30.0, gt=0, description="Seconds to download one adapter from object storage (None: no limit)."
    )
    max_download_tries: int = Field(3, ge=1, description="Tries to download one adapter from object storage.")

    @field_validator("dynamic_lora_loading_path")
    @classmethod
    def _where(cls, value: str) -> str:
        if value.startswith(REMOTE_LORA_SCHEMES) or lora_local_dir(value) is not None:
            return value
        raise ValueError(
            f"must be an absolute directory, a file:/// URI or an {', '.join(REMOTE_LORA_SCHEMES)} prefix, got {value!r}"
        )


def lora_local_dir(path: str) -> Path | None:
    """The directory a local adapter path names (absolute, or ``file:///``); ``None`` for object storage."""
    if path.startswith(LORA_FILE_SCHEME):
        path = path.removeprefix(LORA_FILE_SCHEME)
    return Path(path) if path.startswith("/") else None


def lora_local_adapters(base: Path) -> list[str]:
    """The adapters of a local directory, sorted: its folders holding an ``adapter_config.json`` (PEFT's layout)."""
    if not base.is_dir():
        return []
    return sorted(entry.name for entry in base.iterdir() if (entry / LORA_ADAPTER_CONFIG).is_file())


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

    mode: Mode = Field(
        Mode.AUTO,
        description="mb | eb | v0 | auto (EB+: the controller picks EB or MB) | shadow (MB, with the "
        "controller's choice only published).",
    )
    k: int | None = Field(None, ge=1, description="Initial EB threshold (default: planner.theta_cold x n).")
    n: int | None = Field(None, ge=2, description="Initial cap on running requests (default: engine.max_num_seqs).")
    telemetry_buffer: int = Field(
        16384, ge=1, description="Records the scheduler buffers per kind between two drains (oldest dropped, counted)."
    )

    def initial(self, max_num_seqs: int, theta_cold: float) -> ThresholdUpdate:
        """The thresholds before any controller decision (version 0).

        ``n`` may only lower the engine's start-up ``max_num_seqs`` (vLLM sizes its
        buffers from it); ``k`` defaults to the controller's cold threshold
        ``theta_cold x n``. ``auto`` and ``shadow`` start in MB: the controller
        switches ``auto`` to EB when EB wins.
        """
        n = max_num_seqs if self.n is None else self.n
        if n > max_num_seqs:
            raise ValueError(f"scheduler.n ({n}) must be <= engine.max_num_seqs ({max_num_seqs})")
        k = theory.k_star(theta_cold, n) if self.k is None else self.k
        if k > n:
            raise ValueError(f"scheduler.k ({k}) must be <= n ({n})")
        active = Mode.EB if self.mode in (Mode.EB, Mode.V0) else Mode.MB
        return ThresholdUpdate(mode=self.mode, k=k, n=n, version=0, active=active)


#: Ray Serve's request router for the board-reading policies (a path, so this module imports no Ray).
BOARD_ROUTER = "ebplus.deploy.request_router:BoardRouter"
#: Ray Serve's autoscaling policy for ``policy-first``.
POLICY_FIRST = "ebplus.deploy.autoscaling:PolicyFirst"


class AutoscalingSection(_Section):
    """Ray Serve's replica autoscaling (its ``autoscaling_config``), for the model replicas.

    Serve adds a replica when the ongoing requests per replica, averaged over
    ``look_back_period_s``, stay above ``target_ongoing_requests`` for
    ``upscale_delay_s``, and removes one when they stay below it for
    ``downscale_delay_s``; a removed replica drains (``graceful_shutdown_*``). The
    controller seeds a new replica with the fleet's current plan at its first push
    and forgets a removed one. New replicas need room in the Ray cluster (a free GPU
    node, or KubeRay's autoscaler adding one: the chart's ``rayService.inTreeAutoscaling``).
    """

    min_replicas: int = Field(1, ge=1, description="Fewest replicas (an engine takes minutes to start: no scale to zero).")
    max_replicas: int = Field(ge=1, description="Most replicas.")
    initial_replicas: int | None = Field(None, ge=1, description="Replicas at deployment (default: min_replicas).")
    target_ongoing_requests: float = Field(
        gt=0,
        description=(
            "Ongoing requests per replica Serve scales towards. Pick it below max_ongoing_requests and near the "
            "concurrency a replica runs well at (EB+ needs a full batch to pay off: about the N it plans)."
        ),
    )
    upscale_delay_s: float | None = Field(None, ge=0, description="Seconds of high load before adding replicas (Serve: 30).")
    downscale_delay_s: float | None = Field(
        None, ge=0, description="Seconds of low load before removing replicas (Serve: 600)."
    )
    metrics_interval_s: float | None = Field(None, gt=0, description="How often replicas report load (Serve: 10).")
    look_back_period_s: float | None = Field(None, gt=0, description="Window the load is averaged over (Serve: 30).")
    upscaling_factor: float | None = Field(None, gt=0, description="Multiplies each scale-up step (Serve: 1).")
    downscaling_factor: float | None = Field(None, gt=0, description="Multiplies each scale-down step (Serve: 1).")
    policy: Literal["default", "policy-first"] = Field(
        "default",
        description=(
            "default: Serve's own, ongoing requests per replica against target_ongoing_requests; policy-first: "
            "replicas only when no mode, k or N on today's replicas meets the controller's latency targets at the "
            "demand it measures (ebplus.controller.scaling), asking the controller without waiting on it."
        ),
    )
    utilization: float = Field(
        0.8, gt=0, le=1, description="policy-first: the share of their best capacity replicas may run at."
    )
    scale_down_below: float = Field(
        0.7, gt=0, lt=1, description="policy-first: remove replicas while the demand stays under this share of what one fewer affords."
    )

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingSection:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) must be <= max_replicas ({self.max_replicas})")
        initial = self.initial_replicas
        if initial is not None and not self.min_replicas <= initial <= self.max_replicas:
            raise ValueError(f"initial_replicas ({initial}) must lie in [min_replicas, max_replicas]")
        return self

    def serve_config(self, model: str) -> dict[str, Any]:
        """Serve's ``autoscaling_config`` for ``model``'s replicas: the fields set here (Serve's defaults for the
        rest), and policy-first as Serve's custom policy (a path, so this module imports no Ray)."""
        ours = {"policy", "utilization", "scale_down_below"}
        config = self.model_dump(exclude_none=True, exclude=ours)
        if self.policy == "policy-first":
            kwargs = {"model": model, "utilization": self.utilization, "down": self.scale_down_below}
            config["policy"] = {"policy_function": POLICY_FIRST, "policy_kwargs": kwargs}
        return config


class TelemetrySamplingSection(_Section):
    """The share of its telemetry each replica sends (:mod:`ebplus.replicas.sampling`).

    Below 1 where one controller cannot absorb a whole fleet's telemetry: requests are
    chosen by admission number and steps by whole engine cycle, so the estimate stays
    unbiased; its error at each share is measured in docs/benchmarks/controller.md
    (Telemetry sampling).
    """

    requests: float = Field(
        1.0, gt=0, le=1, description="Share of the requests whose completion and running state a replica reports."
    )
    steps: float = Field(1.0, gt=0, le=1, description="Share of the engine cycles whose steps a replica reports.")

    def sampling(self) -> Sampling:
        return Sampling(requests=self.requests, steps=self.steps)


class RoutingSection(_Section):
    """Which replica a request goes to (:mod:`ebplus.deploy.routing`; docs/benchmarks/fleet.md).

    ``default`` is Ray Serve's own router: power of two choices on queue length. ``phase`` and
    ``least-loaded`` read every replica's phase board, which each replica publishes every
    ``board_interval_s`` (:mod:`ebplus.replicas.board`).
    """

    router: Literal["default", "least-loaded", "phase"] = Field(
        "default",
        description=(
            "default: Ray Serve's power of two choices on queue length; least-loaded: the least prompt tokens to "
            "prefill plus KV tokens held; phase: the replica that admits the request soonest, knowing when each "
            "replica's next EB prefill window opens and how many it admits (in MB: the soonest, then the one "
            "whose next step it delays least)."
        ),
    )
    board_interval_s: float = Field(
        0.1,
        gt=0,
        le=5,
        description=(
            "How often a replica publishes its phase board (phase and least-loaded): an engine-core call and an "
            "actor call each time, so shorter is fresher and costs more CPU beside the engine."
        ),
    )
    stale_s: float = Field(
        2.0,
        gt=0,
        description="A board older than this means the channel is down: the router falls back to power of two choices.",
    )
    load_cap: float | None = Field(
        1.25,  # ebplus.deploy.routing.LOAD_CAP (the replicas may not import the deployment: a test pins the two)
        ge=1,
        allow_inf_nan=False,
        description=(
            "phase: a replica holding more than this many times the mean queue (running + waiting), plus one, is "
            "passed over while another is not; under EB the replica that runs the most opens its window soonest, "
            "and without a cap it keeps drawing requests and slows its decodes (docs/benchmarks/fleet.md). "
            "null: no cap."
        ),
    )

    @model_validator(mode="after")
    def _stale_after_interval(self) -> RoutingSection:
        if self.stale_s <= 2 * self.board_interval_s:
            raise ValueError(f"stale_s ({self.stale_s}) must exceed two board intervals ({2 * self.board_interval_s})")
        return self

    @property
    def uses_board(self) -> bool:
        return self.router != "default"

    def serve_config(self) -> dict[str, Any] | None:
        """Serve's ``request_router_config`` (``None``: Ray's default router)."""
        if not self.uses_board:
            return None
        return {
            "request_router_class": BOARD_ROUTER,
            "request_router_kwargs": {
                "policy": self.router,
                "stale_s": self.stale_s,
                "interval_s": self.board_interval_s,
                "load_cap": self.load_cap,
            },
        }


class ReplicaSection(_Section):
    """The Ray Serve deployment of vLLM replicas."""

    num_replicas: int = Field(1, ge=1, description="Replicas (one per GPU); with autoscaling, leave it unset.")
    autoscaling: AutoscalingSection | None = Field(
        None, description="Let Serve add and remove replicas with the load (None: num_replicas, fixed)."
    )
    resources: CustomResources = Field(
        default_factory=dict,
        description=(
            "Custom Ray resources each replica needs, e.g. {ebplus-replica: 1} to keep replicas on nodes started "
            "with that resource (worker nodes) and off the head."
        ),
    )
    graceful_shutdown_timeout_s: float = Field(
        300.0,
        ge=0,
        description=(
            "A replica being removed (scale-down, rolling update) finishes its requests for up to this long "
            "before it is stopped (Serve's default is 20 s: shorter than a long generation, which would be "
            "cut off). It stops taking new requests at once."
        ),
    )
    graceful_shutdown_wait_loop_s: float = Field(
        1.0, gt=0, description="How often a draining replica checks whether its requests are done."
    )
    accelerator: Literal["cpu", "gpu"] = Field("gpu", description="Where the engine runs.")
    accelerator_type: str | None = Field(None, description="Ray accelerator type to pin replicas to, e.g. 'H200'.")
    num_cpus: float = Field(1.0, ge=0, description="CPUs reserved per replica actor.")
    engine_niceness: NicenessSetting = Field(
        "auto",
        description=(
            "The CPU priority of the engine's processes (vLLM's engine core and its workers), set from the "
            "engine's start on: a niceness from 0 to 19, higher runs later. 'auto': 19 on CPU replicas, where the engine "
            "computes the model on the cores that also route, admit and stream requests, so those get a core as "
            "soon as they ask; unchanged on GPU replicas. 'inherit': unchanged (Ray starts its workers at 15). A "
            "value below the replica's own needs CAP_SYS_NICE; without it the replica logs a warning and serves."
        ),
    )
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
    max_request_output: int | None = Field(
        None,
        ge=1,
        description=(
            "The most output one request may ask for, counted as prompts x n x max_tokens x (1 + logprobs) "
            "(max_tokens unset: the model's length); a request over it is answered 400 naming the limit before "
            "the engine sees it. None: the engine's KV cache capacity in tokens (ebplus.replicas.budget)."
        ),
    )
    stall_timeout_s: float = Field(
        15.0,
        ge=1,
        description=(
            "The ingress ends a request whose replica, having taken it, sent nothing, not even a heartbeat, for "
            "this long: a 503 with Retry-After before the first token, an error event after it. A replica sends "
            "a heartbeat when it takes a request and every heartbeat_s (a fifth of this) while it has nothing "
            "else to send, so silence means it is lost (its node died or was cut off), however long Ray takes to "
            "declare it dead. A request still queued for a free replica is not affected."
        ),
    )
    progress_timeout_s: float | None = Field(
        120.0,
        ge=1,
        description=(
            "The ingress ends a request whose answer has not moved for this long after its first token, although "
            "the replica's heartbeats say it is alive (an engine wedged under it): a 504 error event, then [DONE]. "
            "It must outlast the longest pause a running request can see (a preemption, a long prefill phase). "
            "None: no deadline."
        ),
    )
    routing: RoutingSection = Field(
        default_factory=RoutingSection, description="Which replica a request goes to (Ray's router, or a board router)."
    )
    telemetry_interval_s: float = Field(0.5, gt=0, le=60, description="How often a replica pushes telemetry.")
    telemetry_buffer: int = Field(
        16384, ge=64, description="Records buffered per kind; beyond it records are dropped and counted."
    )
    telemetry_sampling: TelemetrySamplingSection = Field(
        default_factory=TelemetrySamplingSection,
        description="Send a share of the telemetry (1: all): for fleets whose telemetry one controller cannot take.",
    )

    runtime_env: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "Ray runtime environment of each replica (Ray Serve LLM's runtime_env: env_vars, pip, working_dir...); "
            "EB+ Serve adds vLLM's start-up variables to its env_vars."
        ),
    )
    placement_group_config: dict[str, Any] | None = Field(
        None,
        description=(
            "Ray Serve LLM's placement_group_config: the resource bundles and strategy of a replica's engine "
            "workers (None: Ray's, one bundle per tensor x pipeline parallel worker)."
        ),
    )

    @field_validator("runtime_env")
    @classmethod
    def _env_vars(cls, value: dict[str, Any]) -> dict[str, Any]:
        env = value.get("env_vars", {})
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ValueError("env_vars must map names to strings (quote numbers: \"1\")")
        for name, key in RUNTIME_ENV_SET_BY.items():
            if name in env:
                raise ValueError(f"env_vars.{name} is set by EB+ Serve from {key}; set that instead")
        return value

    @field_validator("engine_niceness", mode="before")
    @classmethod
    def _niceness(cls, value: object) -> object:
        return check_niceness(value, ("auto", "inherit"))

    @model_validator(mode="after")
    def _fixed_or_autoscaled(self) -> ReplicaSection:
        if self.autoscaling is not None and "num_replicas" in self.model_fields_set:
            raise ValueError("num_replicas must be left unset with autoscaling (use autoscaling.initial_replicas)")
        return self

    @property
    def heartbeat_s(self) -> float:
        """How often a replica sends a heartbeat on a quiet answer stream (see ``stall_timeout_s``)."""
        return self.stall_timeout_s / 5

    def deployment_options(self, model: str = "") -> dict[str, Any]:
        """The Serve deployment options of ``model``'s replicas (Ray Serve LLM's ``deployment_config``)."""
        options: dict[str, Any] = {
            "max_ongoing_requests": self.max_ongoing_requests,
            "max_queued_requests": self.max_queued_requests,
            "graceful_shutdown_timeout_s": self.graceful_shutdown_timeout_s,
            "graceful_shutdown_wait_loop_s": self.graceful_shutdown_wait_loop_s,
            "ray_actor_options": {"num_cpus": self.num_cpus, "resources": dict(self.resources)},
        }
        router = self.routing.serve_config()
        if router is not None:
            options["request_router_config"] = router
        if self.autoscaling is None:
            options["num_replicas"] = self.num_replicas
        else:
            options["autoscaling_config"] = self.autoscaling.serve_config(model)
        return options
