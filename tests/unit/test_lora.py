"""LoRA adapters: the config in both forms, what the replicas and the ingress are given, and the local adapter directory."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml
from fastapi import HTTPException

from ebplus.deploy import app
from ebplus.deploy.config import ConfigError, parse_config
from ebplus.replicas import lora

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "ray-serve-llm.yaml"


def adapters(root: Path, *names: str) -> Path:
    for name in names:
        (root / name).mkdir(parents=True)
        (root / name / "adapter_config.json").write_text(json.dumps({"r": 8, "max_length": 512}))
    return root


def with_lora(**lora_config: object):
    data = yaml.safe_load(EXAMPLE.read_text())
    data["applications"][0]["args"]["llm_configs"][0]["lora_config"] = lora_config
    return parse_config(data, "x.yaml")


def test_rays_lora_config_is_the_models_lora_section(tmp_path: Path) -> None:
    cfg = with_lora(dynamic_lora_loading_path=str(tmp_path), max_num_adapters_per_replica=4)
    tiny, smollm2 = cfg.models()
    assert tiny.model.lora is not None and smollm2.model.lora is None
    assert tiny.model.lora.dynamic_lora_loading_path == str(tmp_path)
    assert tiny.model.lora.max_num_adapters_per_replica == 4
    assert (
        tiny.where("model.lora.download_timeout_s")
        == "applications[0].args.llm_configs[0].lora_config.download_timeout_s"
    )


def test_the_ebplus_form_takes_the_same_keys() -> None:
    cfg = parse_config({"model": {"lora": {"dynamic_lora_loading_path": "s3://bucket/adapters"}}})
    assert cfg.model.lora is not None and cfg.model.lora.max_download_tries == 3
    with pytest.raises(ConfigError, match=r"model\.lora\.dynamic_lora_loading_path: must be an absolute directory"):
        parse_config({"model": {"lora": {"dynamic_lora_loading_path": "./adapters"}}})


def test_adapters_imply_enable_lora_and_refuse_it_switched_off(tmp_path: Path) -> None:
    cfg = with_lora(dynamic_lora_loading_path=str(tmp_path)).models()[0]
    assert app.engine_kwargs(cfg)["enable_lora"] is True
    without = cfg.model_copy(update={"model": cfg.model.model_copy(update={"lora": None})})
    assert "enable_lora" not in app.engine_kwargs(without)
    data = yaml.safe_load(EXAMPLE.read_text())
    entry = data["applications"][0]["args"]["llm_configs"][0]
    entry["lora_config"] = {"dynamic_lora_loading_path": str(tmp_path)}
    entry["engine_kwargs"]["enable_lora"] = False
    with pytest.raises(ConfigError) as err:
        parse_config(data, "x.yaml")
    assert str(err.value).startswith(
        "x.yaml: applications[0].args.llm_configs[0].lora_config needs "
        "applications[0].args.llm_configs[0].engine_kwargs.enable_lora, which is false"
    ), err.value


def test_the_replicas_llm_config_keeps_a_local_path_and_multiplexes(tmp_path: Path) -> None:
    cfg = with_lora(dynamic_lora_loading_path=f"file://{tmp_path}/", max_num_adapters_per_replica=3).models()[0]
    llm = app.llm_config(cfg, "/models/tiny")
    assert llm.lora_config.dynamic_lora_loading_path == f"file://{tmp_path}"
    assert llm.multiplex_config().max_num_models_per_replica == 3
    remote = app.llm_config(cfg.model_copy(update={"model": cfg.model.model_copy(update={"lora": cfg.model.lora.model_copy(
        update={"dynamic_lora_loading_path": "gs://b/a"})})}), "/models/tiny")  # fmt: skip
    assert remote.lora_config.dynamic_lora_loading_path == "gs://b/a"


def test_local_adapters_are_listed_and_described(tmp_path: Path) -> None:
    base = adapters(tmp_path, "shout", "whisper")
    (base / "not-an-adapter").mkdir()
    assert lora.adapter_ids(str(base), "tiny") == ["tiny:shout", "tiny:whisper"]
    assert lora.adapter_ids(str(base / "missing"), "tiny") == []
    meta = asyncio.run(lora.adapter_metadata("tiny:shout", f"file://{base}"))
    assert meta == {
        "model_id": "tiny:shout",
        "base_model_id": "tiny",
        "max_request_context_length": 512,
        "bucket_uri": str(base / "shout"),
    }


@pytest.mark.parametrize("model_id", ["tiny:nope", "tiny:..", "tiny:", "tiny:a/../../etc"])
def test_an_adapter_that_is_not_there_is_a_404(tmp_path: Path, model_id: str) -> None:
    base = adapters(tmp_path, "shout")
    with pytest.raises(HTTPException) as err:
        asyncio.run(lora.adapter_metadata(model_id, str(base)))
    assert err.value.status_code == 404


def test_the_replicas_loader_reads_a_local_adapter_in_place(tmp_path: Path) -> None:
    base = adapters(tmp_path, "shout")
    llm = app.llm_config(with_lora(dynamic_lora_loading_path=str(base)).models()[0], "/models/tiny")
    loader = lora.AdapterLoader()
    loaded = asyncio.run(loader.load_model_from_config("tiny:shout", llm))
    assert loaded.local_path == str(base / "shout") and loaded.max_total_tokens == 512
    assert asyncio.run(loader.load_model_from_config("tiny:shout", llm)) is loaded  # one id per adapter
    with pytest.raises(HTTPException):
        asyncio.run(loader.load_model_from_config("tiny:gone", llm))


def test_check_finds_the_local_adapters_or_says_what_is_missing(tmp_path: Path) -> None:
    from ebplus.deploy.check import check_lora

    def findings(path: Path) -> list[str]:
        return [str(f) for f in check_lora(with_lora(dynamic_lora_loading_path=str(path)).models()[0])]

    field = "model.lora.dynamic_lora_loading_path"
    assert findings(tmp_path / "none") == [f"{field}: {tmp_path / 'none'} is not a directory"]
    assert check_lora(with_lora(dynamic_lora_loading_path=str(tmp_path / "none")).models()[0])[0].error
    assert findings(tmp_path) == [f"{field}: {tmp_path} holds no adapter (a folder with adapter_config.json)"]
    adapters(tmp_path, "shout")
    assert findings(tmp_path) == [f"{field}: adapters shout in {tmp_path}"]
    assert check_lora(with_lora(dynamic_lora_loading_path="s3://b/a").models()[0]) == []
