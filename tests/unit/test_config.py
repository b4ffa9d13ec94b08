"""deploy/config.py: shipped configs load; bad ones fail with the field path named."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ebplus.controller.messages import Mode
from ebplus.deploy import config
from ebplus.deploy.config import ConfigError, ServeConfig, json_schema, load_config, parse_config

ROOT = Path(__file__).resolve().parents[2]
#: A few of vLLM's engine argument names, so that unknown-key messages are tested without importing vLLM.
VLLM_ARGS = frozenset({"tensor_parallel_size", "pipeline_parallel_size", "max_num_seqs", "seed", "dtype"})


@pytest.fixture(autouse=True)
def vllm_args(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "vllm_arg_names", lambda: VLLM_ARGS)


@pytest.mark.parametrize("name", ["local.yaml", "gpu.yaml"])
def test_shipped_configs_load(name: str) -> None:
    cfg = load_config(ROOT / "deploy" / name)
    assert isinstance(cfg, ServeConfig) and cfg.scheduler.mode is Mode.AUTO


def test_local_is_the_cpu_default() -> None:
    cfg = load_config(ROOT / "deploy" / "local.yaml")
    assert cfg.model.id == "smollm2-135m-instruct" and cfg.model.source == "builtin:smollm2"
    assert cfg.replicas.num_replicas == 1 and cfg.replicas.accelerator == "cpu"
    assert cfg.engine.dtype == "float32"


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"engine": {"max_num_seqs": 1}}, "engine.max_num_seqs: Input should be greater than or equal to 2"),
        ({"scheduler": {"mode": "turbo"}}, "scheduler.mode: Input should be"),
        ({"controller": {"planner": {"eps": 0}}}, "controller.planner.eps"),
        ({"controller": {"window": "big"}}, "controller.window"),
        ({"http": {"port": 70000}}, "http.port"),
        ({"replicas": {"numreplicas": 2}}, "replicas.numreplicas: unknown key (did you mean num_replicas?)"),
        ({"scheduler": {"n": 500}}, "scheduler.n (500) must be <= engine.max_num_seqs (256)"),
        ({"scheduler": {"k": 300}}, "scheduler.k (300) must be <= n (256)"),
        ({"replicas": {"accelerator": "cpu"}}, "engine.cpu_kv_cache_gib is required"),
        ({"engine": {"cpu_kv_cache_gib": 0.25}}, "engine.cpu_kv_cache_gib: must be a whole number of GiB"),
        ({"replicas": {"telemetry_sampling": {"requests": 0}}}, "replicas.telemetry_sampling.requests: Input should be"),
        ({"replicas": {"telemetry_sampling": {"steps": 1.5}}}, "replicas.telemetry_sampling.steps: Input should be"),
        ({"http": {"proxy_location": "Everywhere"}}, "http.proxy_location: Input should be 'EveryNode'"),
        ({"replicas": {"routing": {"router": "p2c"}}}, "replicas.routing.router: Input should be 'default'"),
        ({"replicas": {"routing": {"stale_s": 0.15}}}, "stale_s (0.15) must exceed two board intervals (0.2)"),
        ({"replicas": {"routing": {"load_cap": 0.8}}}, "replicas.routing.load_cap: Input should be greater than or"),
        ({"replicas": {"routing": {"load_cap": math.inf}}}, "replicas.routing.load_cap: Input should be a finite"),
        ({"http": {"ingress_niceness": 20}}, "http.ingress_niceness: must be 'inherit' or a niceness from 0 to 19"),
        ({"http": {"ingress_niceness": "auto"}}, "http.ingress_niceness: must be 'inherit' or a niceness from 0"),
        ({"replicas": {"engine_niceness": "x"}}, "replicas.engine_niceness: must be 'auto', 'inherit' or a niceness"),
        ({"http": {"router_niceness": -1}}, "http.router_niceness: must be 'inherit' or a niceness from 0 to 19"),
    ],
)
def test_invalid_configs_name_the_field(data: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(data, "x.yaml")
    assert needle in str(err.value) and str(err.value).startswith("x.yaml: ")
    assert "<root>" not in str(err.value)


def test_cross_field_error_starts_with_the_field() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"scheduler": {"n": 500}}, "x.yaml")
    assert str(err.value) == "x.yaml: scheduler.n (500) must be <= engine.max_num_seqs (256)"


def test_load_config_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  id: x\n source: y\n")
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    assert str(err.value) == f"{bad}:3:2: not valid YAML: expected <block end>, but found '<block mapping start>' (while parsing a block mapping at 1:1)"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:2:1: not valid YAML: expected ',' or '\]'") as err:
        load_config(bad)
    assert "\n" not in str(err.value) and "<unicode string>" not in str(err.value)
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(bad)


def test_engine_kwargs_pass_through() -> None:
    cfg = parse_config({"engine": {"max_num_batched_tokens": 512, "extra": {"seed": 3}}})
    kw = cfg.engine.engine_kwargs()
    assert kw["max_num_batched_tokens"] == 512 and kw["seed"] == 3 and kw["max_num_seqs"] == 256


def test_json_schema_covers_every_section() -> None:
    schema = json_schema()
    assert set(schema["properties"]) == {
        "model",
        "engine",
        "scheduler",
        "replicas",
        "controller",
        "auth",
        "http",
        "ray",
    }


def test_serve_banner_names_the_ray_cluster() -> None:
    """A driver (fault tests, an operator's shell) needs this cluster's address, not Ray's "auto"."""
    from ebplus.deploy.cli import banner

    cfg = load_config(ROOT / "deploy" / "local.yaml")
    assert "Ray cluster  10.0.0.5:6379" in banner(cfg, "10.0.0.5:6379")
    assert "Ray cluster" not in banner(cfg)


def test_telemetry_sampling_reaches_the_pump_as_a_sampling() -> None:
    """The config's shares are what the replica's and the plugin's pump are built with (1: all)."""
    from ebplus.replicas.sampling import ALL, Sampling

    assert load_config(ROOT / "deploy" / "local.yaml").replicas.telemetry_sampling.sampling() == ALL
    cfg = parse_config({"replicas": {"telemetry_sampling": {"requests": 0.25}}}, "x.yaml")
    assert cfg.replicas.telemetry_sampling.sampling() == Sampling(requests=0.25, steps=1.0)


@pytest.mark.parametrize("router", ["default", "least-loaded", "phase"])
def test_the_routing_section_picks_serves_request_router(router: str) -> None:
    """Ray's own router by default; a board router (by its import path, with the policy's settings) otherwise."""
    cfg = parse_config({"replicas": {"routing": {"router": router, "board_interval_s": 0.25}}}, "x.yaml")
    options = cfg.replicas.deployment_options()
    if router == "default":
        assert "request_router_config" not in options and not cfg.replicas.routing.uses_board
        return
    from ray.serve._private.common import DeploymentHandleSource, DeploymentID
    from ray.serve.config import RequestRouterConfig

    from ebplus.deploy.request_router import BoardRouter
    from ebplus.deploy.routing import LOAD_CAP

    config = RequestRouterConfig(**options["request_router_config"])
    assert config.get_request_router_class() is BoardRouter
    assert config.request_router_kwargs == {"policy": router, "stale_s": 2.0, "interval_s": 0.25, "load_cap": LOAD_CAP}
    # the phase policy's cap, from the config to the router Serve builds (null: none)
    for cap, expected in ((2.0, 2.0), (None, math.inf)):
        routing = {"router": router, "load_cap": cap}
        kwargs = parse_config({"replicas": {"routing": routing}}, "x.yaml").replicas.deployment_options()[
            "request_router_config"]["request_router_kwargs"]  # fmt: skip
        built = BoardRouter(deployment_id=DeploymentID(name="llm", app_name="app"),
                            handle_source=DeploymentHandleSource.UNKNOWN)  # fmt: skip
        built.initialize_state(**kwargs)
        assert kwargs["load_cap"] == cap and built.view()["load_cap"] == (cap if router == "phase" else None)
        if router == "phase":
            assert built.policy.load_cap == expected


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {"engine": {"tensor_parallel_size": 2}},
            "engine.tensor_parallel_size: not an EB+ engine key; vLLM engine arguments go in engine.extra "
            "(or engine_kwargs in the llm_configs form)",
        ),
        ({"engine": {"max_num_seq": 8}}, "engine.max_num_seq: unknown key (did you mean max_num_seqs?)"),
        (
            {"engine": {"tensor_paralel_size": 2}},
            "engine.tensor_paralel_size: not an EB+ engine key nor a vLLM engine argument "
            "(did you mean engine.extra.tensor_parallel_size?)",
        ),
        ({"controller": {"windw": 300}}, "controller.windw: unknown key (did you mean window?)"),
        ({"controller": {"planner": {"thetamin": 0}}}, "controller.planner.thetamin: unknown key (did you mean theta_min?)"),
        ({"scheduler": {"profile": "h200"}}, "scheduler.profile: not an EB+ scheduler key; it belongs in replicas.profile"),
        (
            {"replicas": {"pipeline_parallel_size": 2}},
            "replicas.pipeline_parallel_size: not an EB+ replicas key; vLLM engine arguments go in engine.extra "
            "(or engine_kwargs in the llm_configs form)",
        ),
        ({"schedular": {}}, "schedular: unknown key (did you mean scheduler?)"),
        ({"replicas": {"telemetry_sampling": {"step": 1}}}, "replicas.telemetry_sampling.step: unknown key (did you mean steps?)"),
        ({"auth": {"zzz": 1}}, "auth.zzz: unknown key; auth has admin_token_env, admin_token_file, api_key_env, api_key_file"),
    ],
)
def test_unknown_keys_say_where_they_belong(data: dict, expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(data, "x.yaml")
    assert str(err.value) == f"x.yaml: {expected}"


def test_runtime_env_may_not_set_what_eb_sets() -> None:
    with pytest.raises(ConfigError, match=r"replicas.runtime_env: env_vars.VLLM_MAX_N_SEQUENCES is set by EB\+ Serve from engine.max_num_seqs"):
        parse_config({"replicas": {"runtime_env": {"env_vars": {"VLLM_MAX_N_SEQUENCES": "4"}}}})
    with pytest.raises(ConfigError, match="must map names to strings"):
        parse_config({"replicas": {"runtime_env": {"env_vars": {"X": 1}}}})


def test_the_ingress_niceness_reaches_ray_as_its_per_worker_setting() -> None:
    """``http.ingress_niceness`` travels in the ingress' runtime_env as Ray's ``RAY_worker_niceness`` (the live
    check, that Ray starts the process there: ``tests/e2e/test_serving.py``); ``inherit`` adds nothing. The
    routers' thread's setting (``tests/unit/test_priority.py``) adds to it only where a board router runs."""
    from ebplus.deploy.priority import ingress_env

    http = parse_config({}).http
    assert (http.ingress_niceness, http.router_niceness) == ("inherit", 0)
    assert ingress_env(http.ingress_niceness, http.router_niceness, board_routers=False) == {}
    assert ingress_env(parse_config({"http": {"ingress_niceness": 0}}).http.ingress_niceness, 0, False) == {
        "RAY_worker_niceness": "0"
    }
