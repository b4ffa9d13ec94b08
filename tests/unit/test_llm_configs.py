"""deploy/llm_configs.py: Ray Serve LLM's config read as EB+ deployment configs, errors in its own spelling."""

from __future__ import annotations

import ast
import copy
import importlib.util
from pathlib import Path

import pytest
import yaml

from ebplus.controller.messages import Mode
from ebplus.deploy import config, llm_configs
from ebplus.deploy.config import ConfigError, load_config, parse_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "examples" / "ray-serve-llm.yaml"
A = "applications[0].args."


@pytest.fixture(autouse=True)
def vllm_args(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unknown-key messages without importing vLLM: a few of its engine argument names."""
    monkeypatch.setattr(config, "vllm_arg_names", lambda: frozenset({"tensor_parallel_size", "max_num_seqs", "seed"}))


def example() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def problems(mutate) -> str:
    data = example()
    mutate(data["applications"][0]["args"], data)
    with pytest.raises(ConfigError) as err:
        parse_config(data, "x.yaml")
    return str(err.value)


def test_the_example_maps_onto_one_config_per_model() -> None:
    cfg = load_config(EXAMPLE)
    tiny, smol = cfg.models()
    assert (tiny.model.id, tiny.model.source, smol.model.id, smol.model.source) == (
        "tiny",
        "builtin:tiny",
        "smollm2",
        "builtin:smollm2",
    )
    assert tiny.scheduler.mode is Mode.EB and smol.scheduler.mode is Mode.AUTO  # ebplus.models.tiny wins
    assert (
        smol.engine.max_num_seqs == 32 and smol.engine.max_num_batched_tokens == 512 and smol.engine.dtype == "float32"
    )
    assert tiny.engine.cpu_kv_cache_gib == 1 and tiny.replicas.accelerator == "cpu"
    assert tiny.replicas.deployment_options()["max_ongoing_requests"] == 32
    assert tiny.replicas.num_cpus == 0 and tiny.replicas.profile == "cpu-smollm2"
    assert tiny.http.host == "127.0.0.1" and tiny.http.proxy_location == "HeadOnly" and smol.ray.num_cpus == 3
    assert tiny.controller == smol.controller and tiny.controller.update_every == 100


def test_the_bare_llm_configs_form_is_the_apps_args() -> None:
    """``build_openai_app``'s args (KubeRay's serveConfigV2 passes them to build_app) read the same."""
    data = example()
    args = data["applications"][0]["args"]
    args["ebplus"]["http"] = {"port": 9000}
    cfg = parse_config(args, "args")
    assert [m.model.id for m in cfg.models()] == ["tiny", "smollm2"] and cfg.http.port == 9000


def test_engine_kwargs_take_any_vllm_argument_and_other_ray_fields_are_honoured() -> None:
    entry = {
        "model_loading_config": {"model_id": "m", "model_source": "org/m", "tokenizer_source": "org/tok"},
        "engine_kwargs": {"tensor_parallel_size": 2, "max_num_seqs": 64, "enable_prefix_caching": True},
        "accelerator_type": "H200",
        "deployment_config": {
            "autoscaling_config": {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 32}
        },
        "runtime_env": {"env_vars": {"HF_TOKEN_PATH": "/t"}, "pip": ["x"]},
        "placement_group_config": {"bundles": [{"GPU": 1}, {"GPU": 1}], "strategy": "PACK"},
        "llm_engine": "vLLM",
        "log_engine_metrics": True,
    }
    cfg = parse_config({"llm_configs": [entry], "ingress_deployment_config": {"num_replicas": 2}})
    assert cfg.engine.max_num_seqs == 64
    assert cfg.engine.extra == {"tensor_parallel_size": 2, "enable_prefix_caching": True, "tokenizer": "org/tok"}
    assert cfg.replicas.accelerator_type == "H200" and cfg.replicas.autoscaling.max_replicas == 4
    assert cfg.replicas.runtime_env == {"env_vars": {"HF_TOKEN_PATH": "/t"}, "pip": ["x"]}
    assert cfg.replicas.placement_group_config["strategy"] == "PACK" and cfg.http.ingress_replicas == 2


def test_without_a_model_source_the_model_id_is_the_source() -> None:
    cfg = parse_config({"llm_configs": [{"model_loading_config": {"model_id": "Qwen/Qwen2.5-0.5B-Instruct"}}]})
    assert cfg.model.source == cfg.model.id == "Qwen/Qwen2.5-0.5B-Instruct"


def test_an_llm_config_may_be_a_file(tmp_path: Path) -> None:
    """Ray lets an llm_configs entry name a YAML file; it is read relative to the config file."""
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(example()["applications"][0]["args"]["llm_configs"][0]))
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump({"llm_configs": ["m.yaml"]}))
    assert load_config(tmp_path / "serve.yaml").model.id == "tiny"


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda a, d: a["llm_configs"][0]["engine_kwargs"].update(max_num_seqs=1),
            f"{A}llm_configs[0].engine_kwargs.max_num_seqs: Input should be greater than or equal to 2",
        ),
        (
            lambda a, d: a["llm_configs"][1]["runtime_env"].pop("env_vars"),
            f"{A}llm_configs[1].runtime_env.env_vars.VLLM_CPU_KVCACHE_SPACE is required when "
            f"{A}llm_configs[1].accelerator_config.kind is 'cpu'",
        ),
        (
            lambda a, d: a["llm_configs"][0]["deployment_config"].update(max_ongoing_request=3),
            f"{A}llm_configs[0].deployment_config.max_ongoing_request: unknown key (did you mean max_ongoing_requests?)",
        ),
        (
            lambda a, d: a["llm_configs"][0]["deployment_config"].update(health_check_period_s=3),
            f"{A}llm_configs[0].deployment_config.health_check_period_s: not supported by EB+ Serve (deployment_config "
            "takes autoscaling_config, graceful_shutdown_timeout_s, graceful_shutdown_wait_loop_s, max_ongoing_requests, "
            "max_queued_requests, num_replicas, ray_actor_options)",
        ),
        (
            lambda a, d: a["llm_configs"][0].update(lora_config={"max_num_adapters_per_replica": 2}),
            f"{A}llm_configs[0].lora_config.dynamic_lora_loading_path: Field required",
        ),
        (
            lambda a, d: a["llm_configs"][0].update(lora_config={"dynamic_lora_loading_path": "adapters"}),
            f"{A}llm_configs[0].lora_config.dynamic_lora_loading_path: must be an absolute directory, a file:/// URI",
        ),
        (
            lambda a, d: a["llm_configs"][0].update(lora_config={"dynamic_lora_loading_path": "/a", "max_adapters": 2}),
            f"{A}llm_configs[0].lora_config.max_adapters: unknown key (did you mean max_num_adapters_per_replica?)",
        ),
        (
            lambda a, d: a["llm_configs"][0].update(server_cls="x.Y"),
            f"{A}llm_configs[0].server_cls: EB+ Serve runs its own",
        ),
        (
            lambda a, d: a["llm_configs"][0].update(llm_engine="SGLang"),
            f"{A}llm_configs[0].llm_engine: EB+ Serve runs with 'vLLM' only",
        ),
        (
            lambda a, d: a["llm_configs"][0].update(scheduler={"mode": "eb"}),
            f"{A}llm_configs[0].scheduler: not supported by EB+ Serve (an LLMConfig takes",
        ),
        (
            lambda a, d: a["llm_configs"][0].update(scheduler={"mode": "eb"}),
            "; an EB+ key: it belongs in ebplus.scheduler",
        ),
        (
            lambda a, d: a["llm_configs"][0]["engine_kwargs"].update(cpu_kv_cache_gib=1),
            f"{A}llm_configs[0].engine_kwargs.cpu_kv_cache_gib: not a vLLM engine argument; the CPU KV cache goes in "
            "runtime_env.env_vars.VLLM_CPU_KVCACHE_SPACE",
        ),
        (
            lambda a, d: a["ebplus"].update(replicas={"num_replicas": 2}),
            f"ebplus.replicas.num_replicas: set by Ray Serve LLM's field {A}llm_configs[].deployment_config.num_replicas; "
            "set that instead",
        ),
        (
            lambda a, d: a["ebplus"]["scheduler"].update(mod="eb"),
            "ebplus.scheduler.mod: unknown key (did you mean mode?)",
        ),
        (
            lambda a, d: a["ebplus"]["replicas"].update(tensor_parallel_size=2),
            f"ebplus.replicas.tensor_parallel_size: not an EB+ replicas key; vLLM engine arguments go in {A}llm_configs[].engine_kwargs",
        ),
        (
            lambda a, d: a["ebplus"]["scheduler"].update(max_ongoing_requests=2),
            f"ebplus.scheduler.max_ongoing_requests: not an EB+ scheduler key; it belongs in "
            f"{A}llm_configs[].deployment_config.max_ongoing_requests",
        ),
        (lambda a, d: a["ebplus"].update(schedular={}), "ebplus.schedular: unknown key (did you mean scheduler?)"),
        (lambda a, d: a["ebplus"].update(engine={"dtype": "half"}), "ebplus.engine: engine settings are Ray's"),
        (
            lambda a, d: a["ebplus"]["models"].update(tinyy={}),
            "ebplus.models.tinyy: no llm_configs entry has this model_id (did you mean tiny?)",
        ),
        (
            lambda a, d: a["ebplus"]["models"]["tiny"].update(controller={}),
            "ebplus.models.tiny.controller: not a per-model section (it takes model, scheduler, replicas); controller is "
            "shared by all models: set it in ebplus.controller",
        ),
        (
            lambda a, d: a["ebplus"]["models"]["tiny"].update(scheduler={"n": 500}),
            f"ebplus.models.tiny.scheduler.n (500) must be <= {A}llm_configs[0].engine_kwargs.max_num_seqs (16)",
        ),
        (
            lambda a, d: a["llm_configs"][1]["model_loading_config"].update(model_id="tiny"),
            f"{A}llm_configs[1].model_loading_config.model_id: 'tiny' is also llm_configs[0]'s",
        ),
        (
            lambda a, d: d["http_options"].update(port=70000),
            "http_options.port: Input should be less than or equal to 65535",
        ),
        (
            lambda a, d: d["http_options"].update(root_path="/x"),
            "http_options.root_path: not supported by EB+ Serve (http_options takes host, port)",
        ),
        (
            lambda a, d: d["applications"][0].update(name="llm_app"),
            "applications[0].name: EB+ Serve deploys its application with name 'ebplus'",
        ),
        (
            lambda a, d: d["applications"][0].update(import_path="my:app"),
            "applications[0].import_path: 'my:app': EB+ Serve builds",
        ),
        (lambda a, d: d["applications"].append({}), "applications: EB+ Serve runs one application"),
        (lambda a, d: a.update(llm_configs=[]), f"{A}llm_configs: a list of one LLMConfig per model is required"),
        (
            lambda a, d: a["llm_configs"][0].pop("model_loading_config"),
            f"{A}llm_configs[0].model_loading_config.model_id: required (the name requests ask for)",
        ),
        (lambda a, d: a["ebplus"]["models"].update(tiny="eb"), "ebplus.models.tiny: must be a mapping"),
    ],
)
def test_errors_are_spelled_as_the_file_spells_the_field(mutate, expected: str) -> None:
    message = problems(mutate)
    assert f"x.yaml: {expected}" in message or expected in message, message


def test_a_shared_keys_problem_is_reported_once() -> None:
    message = problems(lambda a, d: a["ebplus"]["controller"].update(windw=3))
    assert message == "x.yaml: ebplus.controller.windw: unknown key (did you mean window?)"


@pytest.mark.parametrize(
    "name", ["deploy/local.yaml", "deploy/gpu.yaml", "tests/e2e/e2e.yaml", "tests/e2e/multinode.yaml"]
)
def test_migrate_writes_a_file_that_loads_back_into_the_same_deployment(name: str, tmp_path: Path) -> None:
    cfg = load_config(ROOT / name)
    migrated = llm_configs.to_llm_form(cfg)
    assert migrated["applications"][0]["import_path"] == "ebplus.deploy.app:build_app"
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(migrated))
    assert load_config(tmp_path / "m.yaml").model_dump() == cfg.model_dump()


def test_migrate_keeps_each_models_own_settings(tmp_path: Path) -> None:
    cfg = load_config(EXAMPLE)
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(llm_configs.to_llm_form(cfg)))
    again = load_config(tmp_path / "m.yaml")
    assert [m.model_dump() for m in again.models()] == [m.model_dump() for m in cfg.models()]


def test_migrate_command_prints_the_llm_form(capsys: pytest.CaptureFixture[str]) -> None:
    from ebplus.cli import main

    assert main(["config", "migrate", str(ROOT / "deploy" / "local.yaml")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# Ray Serve LLM's form of") and "VLLM_CPU_KVCACHE_SPACE: '1'" in out
    assert main(["config", "migrate", "--to", "ebplus", str(EXAMPLE)]) == 2  # two models: not one EB+ file


def test_every_field_of_rays_llmconfig_is_mapped_or_refused() -> None:
    """Read from the installed Ray's source (not imported: it pulls in vLLM), so a new field fails here."""
    spec = importlib.util.find_spec("ray")
    assert spec is not None and spec.origin is not None
    source = Path(spec.origin).parent / "llm" / "_internal" / "serve" / "core" / "configs" / "llm_config.py"
    tree = ast.parse(source.read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "LLMConfig"]
    fields = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and not n.target.id.startswith("_")}
    handled = {k.split(".")[0] for k in llm_configs.MODEL_KEYS} | {
        "engine_kwargs",
        *llm_configs.REFUSED,
        *llm_configs.FIXED,
    }
    assert fields == handled


def test_the_llm_form_is_told_apart_from_ebplus_form() -> None:
    assert llm_configs.is_llm_form({"llm_configs": []}) and llm_configs.is_llm_form({"applications": []})
    assert not llm_configs.is_llm_form({"model": {"id": "x"}})
    assert (
        copy.deepcopy(load_config(EXAMPLE)).where("engine.max_num_seqs")
        == f"{A}llm_configs[0].engine_kwargs.max_num_seqs"
    )
