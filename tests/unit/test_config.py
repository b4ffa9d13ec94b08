"""deploy/config.py: shipped configs load; bad ones fail with the field path named."""

from __future__ import annotations

from pathlib import Path

import pytest

from ebplus.controller.messages import Mode
from ebplus.deploy.config import ConfigError, ServeConfig, json_schema, load_config, parse_config

ROOT = Path(__file__).resolve().parents[2]


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
        ({"replicas": {"numreplicas": 2}}, "replicas.numreplicas: Extra inputs are not permitted"),
        ({"scheduler": {"n": 500}}, "scheduler.n (500) must be <= engine.max_num_seqs (256)"),
        ({"scheduler": {"k": 300}}, "scheduler.k (300) must be <= n (256)"),
        ({"replicas": {"accelerator": "cpu"}}, "engine.cpu_kv_cache_gib is required"),
        ({"engine": {"cpu_kv_cache_gib": 0.25}}, "engine.cpu_kv_cache_gib: must be a whole number of GiB"),
        ({"replicas": {"telemetry_sampling": {"requests": 0}}}, "replicas.telemetry_sampling.requests: Input should be"),
        ({"replicas": {"telemetry_sampling": {"steps": 1.5}}}, "replicas.telemetry_sampling.steps: Input should be"),
        ({"http": {"proxy_location": "Everywhere"}}, "http.proxy_location: Input should be 'EveryNode'"),
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
    bad.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
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
