"""The controller's configuration: the control loop and the EB+ decision's tuning.

One validated model per component (the ``controller:`` section of the deployment
config, the ``controller`` object of the plain-vLLM plugin's
``--additional-config``): unknown keys are errors, every field says what it does.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from ebplus.controller import theory

TokenMean = Annotated[float, Field(ge=1, le=1e7)]  # a mean length in tokens (mu_L, mu_O)

#: The resource Ray puts on the head node only (``ray start --head``); a sliver of it pins an actor there.
HEAD_NODE_RESOURCE = "node:__internal_head__"
#: Resources Ray takes from ``num_cpus``/``num_gpus``/``memory``, never from a ``resources`` mapping.
_BUILTIN_RESOURCES = frozenset({"CPU", "GPU", "memory", "object_store_memory"})


def _custom_only(resources: dict[str, float]) -> dict[str, float]:
    builtin = sorted(set(resources) & _BUILTIN_RESOURCES)
    if builtin:
        raise ValueError(f"{builtin[0]!r} is a built-in Ray resource: set it with num_cpus/num_gpus, not here")
    if "" in resources:
        raise ValueError("a resource name must not be empty")
    return resources


#: Custom Ray resources an actor needs (``ray start --resources`` gives them to nodes): placement by node kind.
CustomResources = Annotated[dict[str, Annotated[float, Field(gt=0, le=1e9)]], AfterValidator(_custom_only)]


class LoopConfig(BaseModel):
    """The closed loop of the EB/MB choice: each mode's predicted time corrected by what it measured.

    See ``ebplus.controller.evidence``: per mode, the replica's recent steps are priced
    by the cost model and compared with their measured seconds; the ratio (the mode's
    bias) scales that mode's predicted seconds per token before the two are compared.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(True, description="Correct each mode's prediction by its measured bias (false: open loop).")
    window_steps: int = Field(4096, ge=16, description="Steps of each mode kept per replica as its evidence.")
    min_steps: int = Field(32, ge=8, description="Steps a mode needs before its bias counts.")
    min_phases: int = Field(
        4, ge=0, description="Prefill phases EB's evidence needs too (costs paid once a phase, in proportion)."
    )
    explore_below: float = Field(
        0.15,
        ge=0,
        lt=1,
        description=(
            "Run the other mode for min_steps steps to measure it when it has no evidence at this load and the "
            "running mode is predicted faster by less than this fraction (the model's confidence is low). "
            "0 never explores."
        ),
    )
    explore_reset: float = Field(
        4.0,
        gt=1,
        description=(
            "Evidence measured at a mean batch or workload mean lengths off by more than this factor counts as "
            "stale: it is still used, but the mode may be explored again."
        ),
    )
    explore_spacing: int = Field(10, ge=1, description="Plans between the end of one exploration and the next.")
    explore_max_plans: int = Field(
        10, ge=1, description="An exploration ends after this many plans even if it measured fewer than min_steps."
    )


class SloConfig(BaseModel):
    """Latency targets of the EB+ decision (``controller.planner.slo``): k, the prefill-run bound and EB vs MB.

    Throughput is flat in k over a wide range while latency is not: k is chosen among the
    thresholds whose predicted throughput is within ``tolerance`` of the best, as the one
    meeting these targets with the most margin (no targets: the smallest stall). A mode
    predicted to miss a target loses to one predicted to meet them all.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    ttft_p99_s: float | None = Field(None, gt=0, description="Target p99 time to first token (s); null: none.")
    itl_p99_s: float | None = Field(None, gt=0, description="Target p99 inter-token latency (s); null: none.")
    max_stall_s: float | None = Field(
        None,
        gt=0,
        description=(
            "Longest a running request may wait between two tokens (s): bounds EB's prefill runs (decode steps are "
            "interleaved into longer prefill phases); null: none."
        ),
    )
    tolerance: float = Field(
        0.0025,
        ge=0,
        lt=1,
        description=(
            "Throughput EB+ may give up for latency: k is picked among the thresholds predicted within this fraction "
            "of the best. 0 with no targets keeps the throughput-optimal k* = theta* x N. The closed forms are "
            "optimistic at small k by 1-2%, so the default is small: 1% predicted cost up to 2.2% measured."
        ),
    )
    safety: float = Field(
        0.25,
        ge=0,
        lt=1,
        description=(
            "A mode counts as meeting a target only when predicted at least this fraction below it, and prefill runs "
            "are sized for (1 - safety) x the stall target: the predictions are steady-state means and percentiles, "
            "bursts and model error push the real tail above them."
        ),
    )

    @property
    def targets(self) -> bool:
        """Whether any latency target is set (asked a few times a plan)."""
        return self.ttft_p99_s is not None or self.itl_p99_s is not None or self.max_stall_s is not None


class PlannerConfig(BaseModel):
    """Tuning of the online EB+ decision (defaults follow the seed authors unless noted)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    eps: float = Field(0.01, gt=0, lt=1, description="Allowed probability that the KV cache overflows (eq. 2).")
    n_star_method: Literal["clt", "paper"] = Field(
        "clt", description="N* from the CLT form (the authors' code) or the paper's eq. (6)."
    )
    n_star_age: Literal["empirical", "geometric"] = Field(
        "empirical",
        description=(
            "Mean age of a running request in N*: 'geometric' is the paper's 1/p0 (exact for geometric "
            "outputs, about twice the truth for the +-50% uniform ones, so N* comes out half as large); "
            "'empirical' is E[O^2]/(2 E[O]) from the window, which equals 1/p0 for geometric outputs."
        ),
    )
    max_num_seqs: int = Field(256, ge=2, description="Upper bound for N: the engine's start-up max_num_seqs.")
    max_num_batched_tokens: int | None = Field(
        None, ge=1, description="The engine's token budget per step (chunks prefills); set from the replica's report."
    )
    theta_cold: float = Field(
        0.10,
        gt=0,
        lt=1,
        description=(
            "theta before the first estimate. Ours is 0.10, not the authors' 0.70: for the reference "
            "profiles theta0 is 0.02-0.15 and a high cold threshold idles most decode slots. Replicas in EB "
            "with a large N on a bandwidth-bound GPU start faster with a lower one, near the theta* the "
            "planner then chooses (docs/benchmarks/fleet.md, the cold threshold)."
        ),
    )
    theta_ema: float = Field(0.3, gt=0, le=1, description="Weight of a new theta* in the moving average.")
    kv_backoff: float = Field(
        0.9,
        gt=0,
        le=1,
        description=(
            "After an update window with more than kv_backoff_tolerance preemptions per completion, N* is "
            "computed for a smaller fraction of the KV capacity (compounding): this factor at kv_backoff_full "
            "preemptions per completion or more, proportionally less below; 1 disables the feedback. N* "
            "assumes running requests of stationary age and exact estimates; a synchronised cohort at "
            "start-up or estimation noise can still overflow the cache, and preemptions are the replica's "
            "direct report of that."
        ),
    )
    kv_backoff_tolerance: float = Field(
        0.03,
        ge=0,
        description=(
            "Preemptions per completion an update window may have without kv_backoff (0: back off on any "
            "preemption). Recomputing a preempted request costs less than an under-filled decode batch on a "
            "bandwidth-limited GPU: backing off at the first preemption cost 2-4% of throughput on "
            "decode-heavy traffic in the simulator (docs/benchmarks/simulator.md)."
        ),
    )
    kv_backoff_full: float = Field(
        1.0,
        ge=0,
        description=(
            "Preemptions per completion at which a window gets the whole kv_backoff cut; a window between "
            "kv_backoff_tolerance and this gets a proportional part (0: always the whole cut). A replica "
            "sized right at the KV edge preempts a few requests per hundred, and a 10% cut for that idled "
            "a tenth of its decode slots until the slow recovery (L40S decode-heavy, three seeds: online "
            "0.980 -> 0.984 of the best fixed k)."
        ),
    )
    kv_recover: float = Field(
        1.02, ge=1, description="Each update window without preemptions restores usable KV by this factor (to 1)."
    )
    n_growth: float = Field(1.5, ge=1, description="N grows at most by this factor per update (shrinks at once).")
    n_settle: float = Field(
        0.05,
        gt=0,
        description=(
            "N grows only on a settled estimate: when the workload's mean decode context moved by more than "
            "this fraction since the previous plan, N may shrink but not grow. In a shift the window of "
            "completions mixes two workloads and lags in the unsafe direction (the new workload's shortest "
            "requests complete first), so N* computed mid-shift overshoots the KV (H200 distribution shift: "
            "N 1,251 where ~950 was safe, 1,928 preemptions)."
        ),
    )
    delta: float = Field(
        0.0,
        ge=0,
        description=(
            "Absolute hysteresis margin of the EB/MB rule (s/token), added to delta_rel's. Ours is 0, not the "
            "authors' 1e-5 (1e-4 in the paper): a margin in s/token does not transfer across GPUs - 1e-5 is a "
            "third of the per-token time on an H200 and two thirds on a B300, enough to pin EB+ to MB."
        ),
    )
    delta_rel: float = Field(
        0.02,
        ge=0,
        lt=1,
        description=(
            "Relative hysteresis: switch only when the other mode is predicted faster by this fraction of the "
            "current mode's per-token time (EB->MB: sticky_eb times as much)."
        ),
    )
    sticky_eb: float = Field(3.0, ge=0, description="Switch EB->MB only when MB wins by sticky_eb x the margin.")
    cooldown: int = Field(
        3,
        ge=0,
        description=(
            "Updates to hold a mode after a switch, unless the observed concurrency has since changed by more "
            "than cooldown_reset x (the switch was made for a load that is gone: e.g. a drain, then a surge)."
        ),
    )
    cooldown_reset: float = Field(2.0, gt=1, description="Concurrency ratio that ends a cooldown early.")
    cold_workloads: tuple[tuple[TokenMean, TokenMean], ...] = Field(
        ((128.0, 1024.0), (512.0, 512.0), (1024.0, 128.0), (512.0, 256.0)),
        description=(
            "(mu_L, mu_O) pairs for the decision before the first estimate: EB+ starts in MB (the authors' "
            "default) and leaves it for EB only if the prior cost model prefers EB, at the observed "
            "concurrency, for every one of these workloads (geometric outputs assumed). The default is the "
            "paper's four synthetic workloads; () keeps MB until the first estimate."
        ),
    )
    cold_output_tokens: TokenMean = Field(
        512.0,
        description=(
            "Before the first estimate, N is capped at the N* of geometric outputs of this mean (or the requests' "
            "own caps, where smaller) and the prompts the replica is running: the KV the first cohort's outputs "
            "will need. Without it a cold replica admits up to max_num_seqs, fills its KV cache with prompts, and "
            "preempts for every token its cohort then decodes (H200, paper workload at c = 2048: 327 preemptions "
            "before the first estimate)."
        ),
    )
    min_concurrency: float = Field(16.0, ge=0, description="No EB/MB decision while observed concurrency is lower.")
    theta_min: float = Field(theory.THETA_MIN, gt=0, lt=1, description="Lower clamp of theta*.")
    theta_max: float = Field(theory.THETA_MAX, gt=0, lt=1, description="Upper clamp of theta*.")
    delta_max_factor: float = Field(
        theory.DELTA_THETA_MAX_FACTOR, ge=0, description="Delta theta is clamped to [0, factor * theta0]."
    )

    loop: LoopConfig = Field(default_factory=LoopConfig, description="The closed loop of the EB/MB choice.")
    slo: SloConfig = Field(default_factory=SloConfig, description="Latency targets: the choice of k and of the mode.")

    @model_validator(mode="after")
    def _theta_bounds(self) -> PlannerConfig:
        if self.theta_min > self.theta_max:
            raise ValueError(f"theta_min ({self.theta_min}) must be <= theta_max ({self.theta_max})")
        return self


class ControllerConfig(BaseModel):
    """Settings of the control loop (the ``controller:`` section of the deployment config)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window: int = Field(
        500,
        ge=10,
        description=(
            "Finished requests the departure model is fitted to (W_O, split evenly across replicas), with every "
            "request admitted since the oldest of them that is still running (censored at its age)."
        ),
    )
    input_window: int = Field(500, ge=10, description="Recent prompt lengths mu_L is averaged over (W_L).")
    update_every: int = Field(100, ge=1, description="Completions (fleet-wide) between re-estimations (M).")
    min_samples: int = Field(30, ge=1, description="No estimate before this many completions are held.")
    first_update: int = Field(
        30,
        ge=1,
        description=(
            "Completions before the first estimate (then every update_every). Until then a cold controller "
            "runs EB+ in MB with a guessed k: deciding after 30 rather than 100 completions saves most of "
            "that cold period (at c=512 on a bandwidth-limited GPU about 3% of a 4000-request run)."
        ),
    )
    step_window: int = Field(2048, ge=16, description="Step timings kept per step kind and replica.")
    min_steps: int = Field(20, ge=3, description="Step samples needed before a cost part is fitted.")
    cost_refit_every: int = Field(
        10,
        ge=1,
        description="Workload updates between cost-model refits of a replica (hardware drifts slowly).",
    )
    concurrency_ema: float = Field(
        0.05, gt=0, le=1, description="Weight of each step's running+waiting in the concurrency EMA."
    )
    history: int = Field(256, ge=1, description="Decisions kept in the history.")
    replan_concurrency: float | None = Field(
        2.0,
        gt=1,
        description=(
            "Re-plan a replica at once when its observed concurrency moves by this factor from the value of "
            "its last plan (None: only every update_every completions)."
        ),
    )
    stagger: Literal["on", "off"] = Field(
        "on",
        description=(
            "Offset the EB replicas' prefill windows so that they open in turn (controller/stagger.py): "
            "'on' whenever two replicas or more run EB (a single replica or an all-MB fleet is never "
            "staggered), 'off' never. The fleet benchmark: docs/benchmarks/fleet.md#staggered-windows."
        ),
    )
    planner: PlannerConfig = Field(default_factory=PlannerConfig, description="The EB+ decision's tuning.")
    # -- the actor around the loop (ignored by an in-process FleetController)
    state_dir: str | None = Field(
        None, description="Directory for the persisted state; default: Ray's internal KV store."
    )
    max_restarts: int = Field(-1, ge=-1, description="Actor restarts Ray attempts (-1: unlimited).")
    placement: Literal["head", "any"] = Field(
        "head",
        description=(
            "Where the controller actor runs: 'head' pins it to the Ray head node, beside the GCS that holds "
            "its state (a worker node's loss then never takes the controller with it); 'any' lets Ray choose "
            "among the nodes that have `resources`."
        ),
    )
    resources: CustomResources = Field(
        default_factory=dict,
        description=(
            "Custom Ray resources the controller's node must have, e.g. {ebplus-controller: 0.01} with "
            "placement 'any' for a node started with `--resources '{\"ebplus-controller\": 1}'`. Give the "
            "resource to two nodes or more: Ray restarts the actor after a node loss only where it fits."
        ),
    )
    stale_replica_s: float = Field(60.0, gt=0, description="Forget replicas silent this long.")
    persist_every_s: float = Field(2.0, gt=0, description="Minimum seconds between state snapshots.")
