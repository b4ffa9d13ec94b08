"""Ray Serve LLM's own config served by ``ebplus serve``: two models behind one OpenAI API, one controller.

The file is ``deploy/examples/ray-serve-llm.yaml`` as shipped (only its ports moved off the
e2e tier's), so the example in the docs is the one that is known to serve.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from harness import Deployment, deployed

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "ray-serve-llm.yaml"
MODELS = {"tiny": 16, "smollm2": 32}  # model id -> its engine_kwargs.max_num_seqs in the example


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["http_options"]["port"] = 18300
    data["applications"][0]["args"]["ebplus"]["ray"]["metrics_export_port"] = 18380
    work = tmp_path_factory.mktemp("ray-serve-llm")
    config = work / "ray-serve-llm.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    with deployed(config, work / "serve.log", "e2e-admin-token") as dep:
        yield dep


def test_both_models_are_listed_and_answer(two_models: Deployment) -> None:
    base = two_models.base_url
    listed = httpx.get(f"{base}/v1/models", timeout=30).json()
    assert sorted(card["id"] for card in listed["data"]) == sorted(MODELS)
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
