"""Ray Serve LLM's own config served by ``ebplus serve``: two models behind one OpenAI API, one controller.

The file is ``deploy/examples/ray-serve-llm.yaml`` as shipped (only its ports moved off the
e2e tier's), so the example in the docs is the one that is known to serve, plus Ray's
``lora_config`` on the tiny model: two adapters in a local directory, served as
``tiny:<adapter>``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from harness import Deployment, deployed
from harness.lora import write_tiny_adapter

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "ray-serve-llm.yaml"
MODELS = {"tiny": 16, "smollm2": 32}  # model id -> its engine_kwargs.max_num_seqs in the example
ADAPTERS = ("shout", "whisper")  # the tiny model's LoRA adapters, written by the fixture


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["http_options"]["port"] = 18300
    data["applications"][0]["args"]["ebplus"]["ray"]["metrics_export_port"] = 18380
    work = tmp_path_factory.mktemp("ray-serve-llm")
    for seed, name in enumerate(ADAPTERS, start=1):
        write_tiny_adapter(work / "adapters" / name, seed)
    data["applications"][0]["args"]["llm_configs"][0]["lora_config"] = {
        "dynamic_lora_loading_path": str(work / "adapters"),
        "max_num_adapters_per_replica": 2,
    }
    config = work / "ray-serve-llm.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    with deployed(config, work / "serve.log", "e2e-admin-token") as dep:
        yield dep


def test_both_models_are_listed_and_answer(two_models: Deployment) -> None:
    base = two_models.base_url
    listed = httpx.get(f"{base}/v1/models", timeout=30).json()
    assert sorted(card["id"] for card in listed["data"]) == sorted([*MODELS, *(f"tiny:{a}" for a in ADAPTERS)])
    for model in MODELS:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 8,
        }
        r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["model"] == model and answer["usage"]["completion_tokens"] > 0
        r = httpx.post(
            f"{base}/v1/completions", json={"model": model, "prompt": "Paris is", "max_tokens": 4}, timeout=300
        )
        assert r.status_code == 200 and r.json()["model"] == model, r.text
    r = httpx.post(f"{base}/v1/completions", json={"model": "nope", "prompt": "x", "max_tokens": 2}, timeout=60)
    assert 400 <= r.status_code < 500


def test_each_models_replica_runs_its_scheduler_under_the_one_controller(two_models: Deployment) -> None:
    """Both replicas register with the same controller, each saying its model; the tiny model's
    ebplus.models override (mode eb) holds; each replica's EB+ metrics carry its own model's name."""
    replicas = two_models.thresholds()["replicas"]
    by_model = {r["model"]: r for r in replicas.values()}
    assert {model: r["max_num_seqs"] for model, r in by_model.items()} == MODELS
    assert by_model["tiny"]["mode"] == "eb" and by_model["smollm2"]["mode"] == "auto"
    text = httpx.get(f"{two_models.base_url}/metrics", timeout=30).text
    labelled = {
        sample.labels["ReplicaId"]: sample.labels["model_name"]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "ebplus_threshold_k"
    }
    assert labelled == {rid: r["model"] for rid, r in replicas.items()}


def test_each_lora_adapter_answers_with_its_own_weights(two_models: Deployment) -> None:
    """``tiny:<adapter>`` reaches the adapter (greedy tokens differ from the base model's and from
    each other's); an adapter that is not in the directory is a 404 naming it."""
    base = two_models.base_url

    def tokens(model: str) -> str:
        body = {"model": model, "prompt": "def f_1(x", "max_tokens": 12, "temperature": 0}
        r = httpx.post(f"{base}/v1/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        assert r.json()["model"] == model
        return r.json()["choices"][0]["text"]

    answers = {model: tokens(model) for model in ("tiny", *(f"tiny:{a}" for a in ADAPTERS))}
    assert len(set(answers.values())) == len(answers), answers
    assert tokens("tiny:shout") == answers["tiny:shout"]  # loaded once, the same weights again
    r = httpx.post(f"{base}/v1/completions", json={"model": "tiny:nope", "prompt": "x", "max_tokens": 2}, timeout=60)
    assert r.status_code == 404 and "nope" in r.text, r.text
    card = httpx.get(f"{base}/v1/models/tiny:shout", timeout=30)
    assert card.status_code == 200 and card.json()["id"] == "tiny:shout", card.text
