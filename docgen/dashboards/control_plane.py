"""The "EB+ control plane" dashboard: what the controller estimated and decided, per replica and fleet-wide."""

from __future__ import annotations

from docgen.dashboards.grafana import (
    RATE,
    Dashboard,
    Panel,
    Row,
    Target,
    datasource_var,
    metric,
    quantile,
    replica_vars,
)

#: How the state timeline shows ebplus_policy_eb (0 or 1 per replica).
EB_MB = [
    {
        "type": "value",
        "options": {
            "0": {"text": "MB (mixed)", "color": "blue", "index": 0},
            "1": {"text": "EB (exclusive)", "color": "orange", "index": 1},
        },
    }
]


def dashboard() -> Dashboard:
    """Decisions per replica, the fleet's workload estimate, the controller's health, the cost model."""
    by_replica = "{{ReplicaId}}"
    return Dashboard(
        uid="ebplus-control-plane",
        title="EB+ control plane",
        description="What the EB+ controller estimated and decided, per replica and fleet-wide.",
        file="ebplus-control-plane.json",
        variables=[
            datasource_var(),
            *replica_vars(),
        ],
        rows=[
            Row(
                "Decisions (per replica)",
                [
                    Panel(
                        "Active policy per replica",
                        "The batching policy each replica runs over time: EB (exclusive prefill/decode phases) or "
                        "MB (mixed steps). In mode auto the controller switches it at the EB/MB crossover.",
                        [Target(f"max by (ReplicaId) ({metric('ebplus_policy_eb')})", by_replica)],
                        kind="state-timeline",
                        mappings=EB_MB,
                    ),
                    Panel(
                        "Configured mode per replica",
                        "The mode each replica was configured with (mb, eb, v0 or auto = EB+), or an operator override.",
                        [
                            Target(
                                f"max by (ReplicaId, mode) ({metric('ebplus_mode_info')}) == 1",
                                "{{ReplicaId}}: {{mode}}",
                            )
                        ],
                        kind="stat",
                    ),
                    Panel(
                        "EB threshold k, batch cap N and N*",
                        "k: free slots that trigger a prefill phase; N: cap on running requests; N*: the memory-safe "
                        "batch size of the latest plan (eq. 6). Requests.",
                        [
                            Target(f"max by (ReplicaId) ({metric('ebplus_threshold_k')})", "k {{ReplicaId}}"),
                            Target(f"max by (ReplicaId) ({metric('ebplus_batch_cap_n')})", "N {{ReplicaId}}"),
                            Target(f"max by (ReplicaId) ({metric('ebplus_n_star')})", "N* {{ReplicaId}}"),
                        ],
                    ),
                    Panel(
                        "Threshold fractions θ0, Δθ, θ*",
                        "θ0: CFR threshold (eq. 3); Δθ: the IFR correction for rising hazards (eq. 5); "
                        "θ* = θ0 + Δθ (clamped); θ: the smoothed value k is computed from (k = θ·N).",
                        [
                            Target(f"max by (ReplicaId) ({metric('ebplus_theta0')})", "θ0 {{ReplicaId}}"),
                            Target(f"max by (ReplicaId) ({metric('ebplus_delta_theta')})", "Δθ {{ReplicaId}}"),
                            Target(f"max by (ReplicaId) ({metric('ebplus_theta_star')})", "θ* {{ReplicaId}}"),
                            Target(f"max by (ReplicaId) ({metric('ebplus_theta')})", "θ {{ReplicaId}}"),
                        ],
                        unit="percentunit",
                    ),
                    Panel(
                        "Mode switches (EB↔MB)",
                        "Changes of the active policy per replica in the last hour. Frequent switching means the "
                        "workload sits at the crossover; hysteresis and cooldown bound it.",
                        [
                            Target(
                                f"max by (ReplicaId) (increase({metric('ebplus_mode_switches_total')}[1h]))", by_replica
                            )
                        ],
                    ),
                    Panel(
                        "Phase switches per second",
                        "Switches between prefill and decode phases of the EB scheduler (0 in MB).",
                        [
                            Target(
                                f"sum by (ReplicaId) (rate({metric('ebplus_phase_switches_total')}[{RATE}]))",
                                by_replica,
                            )
                        ],
                        unit="ops",
                    ),
                    Panel(
                        "EB/MB margin",
                        "EB's minus MB's seconds per token, each as the model predicts it times the bias measured on "
                        "the replica's own steps of that mode: above 0 favours MB, below 0 favours EB. Switches use "
                        "hysteresis around 0.",
                        [
                            Target(
                                f"max by (ReplicaId) ({metric('ebplus_crossover_margin_seconds_per_token')})",
                                by_replica,
                            )
                        ],
                        unit="s",
                    ),
                    Panel(
                        "Predicted vs measured, per mode",
                        "The model's seconds per token for EB and MB at the last plan, and each times its measured "
                        "bias (what the decision compares). Where a mode has no evidence its bias is taken as 1.",
                        [
                            Target(
                                f"max by (ReplicaId, mode) ({metric('ebplus_mode_predicted_seconds_per_token')})",
                                "predicted {{mode}} {{ReplicaId}}",
                            ),
                            Target(
                                f"max by (ReplicaId, mode) ({metric('ebplus_mode_predicted_seconds_per_token')} * "
                                f"{metric('ebplus_mode_bias')})",
                                "measured {{mode}} {{ReplicaId}}",
                            ),
                        ],
                        unit="s",
                    ),
                    Panel(
                        "Measured bias per mode",
                        "Measured over model time of each mode's recent steps on the replica: 1 means the cost model "
                        "prices the mode right; above 1, the mode is slower than modelled (e.g. a phase-switch cost).",
                        [Target(f"max by (ReplicaId, mode) ({metric('ebplus_mode_bias')})", "{{mode}} {{ReplicaId}}")],
                        decimals=3,
                    ),
                    Panel(
                        "EB+ choice (shadow: what it would run)",
                        "1 while EB+ chooses EB; in shadow mode the replica keeps running MB. Explorations: runs of "
                        "the other mode to measure it, in the last hour.",
                        [
                            Target(
                                f"max by (ReplicaId) ({metric('ebplus_policy_planned_eb')})", "EB chosen {{ReplicaId}}"
                            ),
                            Target(
                                f"max by (ReplicaId) (increase({metric('ebplus_explorations_total')}[1h]))",
                                "explorations {{ReplicaId}}",
                            ),
                        ],
                    ),
                    Panel(
                        "Throughput per mode",
                        "Tokens per second of busy engine time in each mode (EB, MB) the replica ran: the measured "
                        "side of the EB/MB decision, over the dashboard's rate window.",
                        [
                            Target(
                                f"sum by (ReplicaId, mode) (rate({metric('ebplus_mode_tokens_total')}[{RATE}])) / "
                                f"sum by (ReplicaId, mode) (rate({metric('ebplus_mode_step_seconds_total')}[{RATE}]))",
                                "{{mode}} {{ReplicaId}}",
                            )
                        ],
                        unit="short",
                    ),
                    Panel(
                        "Observed concurrency",
                        "EMA of running + waiting requests per replica: the N the throughput model is evaluated at.",
                        [Target(f"max by (ReplicaId) ({metric('ebplus_concurrency_observed')})", by_replica)],
                    ),
                    Panel(
                        "Thresholds not yet applied",
                        "Published threshold version minus the version the replica reports applied: 0 when every "
                        "replica runs the controller's latest decision.",
                        [
                            Target(
                                f"max by (ReplicaId) ({metric('ebplus_threshold_version')}) - "
                                f"max by (ReplicaId) ({metric('ebplus_applied_version')})",
                                by_replica,
                            )
                        ],
                    ),
                    Panel(
                        "KV back-offs per second",
                        "Prefill phases ended early for lack of KV blocks (EB scheduler), per replica.",
                        [
                            Target(
                                f"sum by (ReplicaId) (rate({metric('ebplus_kv_backoffs_total')}[{RATE}]))", by_replica
                            )
                        ],
                        unit="ops",
                    ),
                ],
            ),
            Row(
                "Staggered prefill windows",
                [
                    Panel(
                        "Stagger on",
                        "1 while the controller offsets the EB replicas' prefill windows so that some replica opens "
                        "one soon (controller.stagger; the controller turns it off where it does not help, e.g. "
                        "with fewer than two EB replicas). Its decision is in GET /admin/thresholds under stagger.",
                        [Target(f"max({metric('ebplus_stagger_on')})", "on")],
                        kind="stat",
                        width=6,
                    ),
                    Panel(
                        "Stagger period per replica",
                        "Period of each replica's timed prefill windows (seconds; 0: the replica is not staggered "
                        "and opens a window when k decode slots are free).",
                        [Target(f"max by (ReplicaId) ({metric('ebplus_stagger_period_seconds')})", by_replica)],
                        unit="s",
                        width=9,
                    ),
                    Panel(
                        "Stagger phase per replica",
                        "Where in the period each replica's windows fall, in [0, 1): staggered replicas spread "
                        "over the interval rather than sharing a phase.",
                        [Target(f"max by (ReplicaId) ({metric('ebplus_stagger_phase')})", by_replica)],
                        decimals=2,
                        width=9,
                    ),
                    Panel(
                        "Windows opened by the stagger's timer",
                        "EB prefill windows per second that a replica opened on its timer with fewer than k slots "
                        "free: the stagger admitting early. 0 everywhere while it is on means it changes nothing.",
                        [
                            Target(
                                f"sum by (ReplicaId) (rate({metric('ebplus_stagger_windows_total')}[{RATE}]))",
                                by_replica,
                            )
                        ],
                        unit="ops",
                        width=24,
                    ),
                ],
            ),
            Row(
                "Workload estimate (fleet)",
                [
                    Panel(
                        "p̂0: hazard of output lengths at t=0",
                        "Estimated probability per token that a request finishes at its first token (1/token); "
                        "≈ 1/μ_O for memoryless outputs.",
                        [Target(f"max({metric('ebplus_workload_p0')})", "p̂0")],
                        decimals=6,
                    ),
                    Panel(
                        "η̂: hazard slope",
                        "Estimated growth of the finishing hazard per token (1/token²). Above 0 means outputs are "
                        "more regular than memoryless, which raises θ* by Δθ.",
                        [Target(f"max({metric('ebplus_workload_eta')})", "η̂")],
                        decimals=9,
                    ),
                    Panel(
                        "μ̂_L and μ̂_O: mean input and output length",
                        "Means of the sliding windows of input lengths (W_L) and output lengths (W_O), tokens.",
                        [
                            Target(f"max({metric('ebplus_workload_mu_l_tokens')})", "μ̂_L (input)"),
                            Target(f"max({metric('ebplus_workload_mu_o_tokens')})", "μ̂_O (output)"),
                        ],
                    ),
                    Panel(
                        "Samples in the estimation window",
                        "Output lengths held in W_O (no estimate before the configured minimum).",
                        [Target(f"max({metric('ebplus_workload_samples')})", "samples")],
                    ),
                ],
            ),
            Row(
                "Controller health",
                [
                    Panel(
                        "Controller update latency",
                        "Time of one re-estimation and re-plan of the whole fleet, p50 and p99 (target: under 2 ms).",
                        [
                            Target(quantile(0.5, "ebplus_controller_update_seconds"), "p50"),
                            Target(quantile(0.99, "ebplus_controller_update_seconds"), "p99"),
                        ],
                        unit="s",
                    ),
                    Panel(
                        "Re-estimations per minute",
                        "Controller updates (one every update_every completions, plus overrides and manual recomputes), "
                        "and replica re-plans that failed (the replica kept its plan; anything above 0 is a bug: "
                        "see the controller log).",
                        [
                            Target(
                                f"60 * sum(rate({metric('ebplus_controller_updates_total')}[{RATE}]))", "updates/min"
                            ),
                            Target(
                                f"60 * sum(rate({metric('ebplus_controller_plan_errors_total')}[{RATE}]))",
                                "failed re-plans/min",
                            ),
                        ],
                    ),
                    Panel(
                        "Telemetry received",
                        "Records the controller accepted per second: completions, steps, batches, aborted.",
                        [
                            Target(
                                f"sum by (kind) (rate({metric('ebplus_telemetry_received_total')}[{RATE}]))", "{{kind}}"
                            )
                        ],
                        unit="ops",
                    ),
                    Panel(
                        "Telemetry rejected",
                        "Records the controller rejected per second, by reason (bad types, non-finite values, unknown "
                        "replica...). Anything above 0 points at a replica bug or version skew.",
                        [
                            Target(
                                f"sum by (reason) (rate({metric('ebplus_telemetry_rejected_total')}[{RATE}]))",
                                "{{reason}}",
                            )
                        ],
                        unit="ops",
                    ),
                    Panel(
                        "Telemetry dropped by replicas",
                        "Records replicas dropped because their buffer was full (per second, by kind).",
                        [
                            Target(
                                f"sum by (ReplicaId, kind) (rate({metric('ebplus_telemetry_dropped_total')}[{RATE}]))",
                                "{{ReplicaId}} {{kind}}",
                            )
                        ],
                        unit="ops",
                    ),
                    Panel(
                        "Overrides active",
                        "Operator overrides (PUT /admin/overrides) in force; while one is, the controller's own "
                        "decision is not applied to the replicas it pins.",
                        [Target(f"max({metric('ebplus_overrides_active')})", "overrides")],
                        kind="stat",
                        width=6,
                    ),
                    Panel(
                        "Controller up / replicas known",
                        "1 if the controller actor answered the last scrape; replicas registered with it.",
                        [
                            Target(f"min({metric('ebplus_controller_up')})", "up"),
                            Target(f"max({metric('ebplus_replicas')})", "replicas"),
                        ],
                        kind="stat",
                        width=6,
                    ),
                ],
            ),
            Row(
                "Cost model (per replica)",
                [
                    Panel(
                        "Fixed step cost α by step kind",
                        "Fitted fixed cost of a prefill, decode and mixed step (seconds), per replica.",
                        [
                            Target(
                                f"max by (ReplicaId, kind) ({metric('ebplus_cost_alpha_seconds')})",
                                "{{ReplicaId}} {{kind}}",
                            )
                        ],
                        unit="s",
                    ),
                    Panel(
                        "Per-token cost β by step kind",
                        "Fitted cost per token of prefill and decode steps (seconds/token), per replica.",
                        [
                            Target(
                                f"max by (ReplicaId, kind) ({metric('ebplus_cost_beta_seconds_per_token')})",
                                "{{ReplicaId}} {{kind}}",
                            )
                        ],
                        unit="s",
                    ),
                ],
            ),
        ],
    )
