"""``ebplus profile``: fit a hardware cost profile on a real vLLM engine.

vLLM is imported only inside :func:`run_profile`, so ``ebplus --help`` stays fast.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ebplus.arguments import positive_int


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile",
        help="fit a hardware cost profile on a real vLLM engine",
        description=(
            "Start the deployment's vLLM engine in this process (the EB+ scheduler in MB mode), drive "
            "it through prefill-only, decode-only and mixed steps of controlled sizes, fit alpha_p, "
            "beta_p, alpha_d, beta_d, alpha_mb, beta_mb(r) = a + b r + c r^2 and the KV-read cost "
            "beta_kv with the controller's robust cost-model fitter, and write a profile YAML in the "
            "simulator's format "
            "(controller/profiles/<name>.yaml). Takes a few minutes for SmolLM2 on 2 CPU cores."
        ),
        epilog="Example: ebplus profile --config deploy/local.yaml --name cpu-smollm2",
    )
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="deployment config (engine + model); default: the packaged deploy/local.yaml, from any directory",
    )
    p.add_argument(
        "--model",
        default=None,
        help="override model.source (a directory, builtin:smollm2, builtin:tiny), validated as the file is",
    )
    p.add_argument("--name", default=None, help="profile name (default: cpu-<model id> or gpu-<model id>)")
    p.add_argument("--out", type=Path, default=None, help="output YAML (default: controller/profiles/<name>.yaml)")
    p.add_argument("--rounds", type=positive_int, default=None, help="measurement rounds (default 3); up to 2 more, one at a time, while a step kind cannot be fitted")
    p.add_argument("--quick", action="store_true", help="a short plan for smoke tests (two small rounds)")
    p.add_argument("--steps-out", type=Path, default=None, help="also write the raw step rows (JSON lines)")
    p.set_defaults(run=run_profile)


def _load_config(path: Path | None, model: str | None):
    """The deployment config, without its prior profile (which may be the very file being made)."""
    import yaml

    from ebplus.deploy.config import DEFAULT_CONFIG, ConfigError, parse_config, with_overrides

    path = DEFAULT_CONFIG if path is None else path
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read config: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the configuration must be a mapping")
    replicas = data.get("replicas")
    if isinstance(replicas, dict):
        replicas = {k: v for k, v in replicas.items() if k not in ("profile", "profiles")}
        data = {**data, "replicas": replicas}
    cfg = parse_config(data, str(path))
    return with_overrides(cfg, {} if model is None else {"model.source": ("--model", model)})


def run_profile(args: argparse.Namespace) -> int:
    import dataclasses

    import msgspec

    from ebplus.controller.cost_model import PROFILE_DIR, dump_profile
    from ebplus.controller.messages import Mode
    from ebplus.deploy.app import model_path
    from ebplus.profiler import profiling
    from ebplus.profiler.local_engine import start_llm

    cfg = _load_config(args.config, args.model)
    plan = profiling.QUICK_PLAN if args.quick else profiling.ProfilePlan()
    if args.rounds is not None:
        plan = dataclasses.replace(plan, rounds=args.rounds)
    kind = "cpu" if cfg.replicas.accelerator == "cpu" else "gpu"
    name = args.name or f"{kind}-{cfg.model.id.split('-')[0]}"
    out = args.out or PROFILE_DIR / f"{name}.yaml"

    def log(msg: str) -> None:
        print(f"[profile] {msg}", flush=True)

    source = model_path(cfg, build=True)
    log(f"engine: {source} {cfg.engine.engine_kwargs()}")
    llm = start_llm(cfg, source, scheduler=True, mode=Mode.MB)
    measurement = profiling.measure(llm, plan, log)
    if args.steps_out is not None:
        # one StepRecord per line, in the wire's array form: [prefill, decode, running, waiting, seconds, kv]
        args.steps_out.write_bytes(b"".join(msgspec.json.encode(s) + b"\n" for s in measurement.steps))
    fit = profiling.fit_profile(measurement.steps)
    profile = profiling.build_profile(name, fit, measurement, cfg.model.id, cfg.engine.engine_kwargs())
    out.parent.mkdir(parents=True, exist_ok=True)
    dump_profile(profile, out)
    m = profile
    log(
        f"alpha_p={m.alpha_p:.4g} s beta_p={m.beta_p:.4g} s/token alpha_d={m.alpha_d:.4g} s "
        f"beta_d={m.beta_d:.4g} s/seq alpha_mb={m.alpha_mixed:.4g} s beta_mb={[float(f'{x:.4g}') for x in m.beta_mb]} "
        f"kv_capacity_tokens={m.kv_capacity_tokens}"
    )
    log(f"median relative error per kind: {profiling.residuals(fit.model, measurement.steps)}")
    print(out)
    return 0
