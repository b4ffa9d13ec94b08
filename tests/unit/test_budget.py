"""The per-request output budget (ebplus.replicas.budget), in the replica and in the plain-vLLM plugin."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from ebplus.deploy import vllm_plugin
from ebplus.replicas.budget import OutputBudget, requested_output

BOMB = {"model": "m", "prompt": "hi", "n": 64, "max_tokens": 2000, "logprobs": 20, "ignore_eos": True}


def engine_config(blocks: int = 1000, block_size: int = 16, max_model_len: int = 2048) -> SimpleNamespace:
    """The two parts of a ``VllmConfig`` the budget reads, as the API server holds them after start-up."""
    return SimpleNamespace(
        cache_config=SimpleNamespace(num_gpu_blocks=blocks, block_size=block_size),
        model_config=SimpleNamespace(max_model_len=max_model_len),
    )


@pytest.mark.parametrize(
    ("body", "asked"),
    [
        (BOMB, 64 * 2000 * 21),
        ({"prompt": ["a", "b", "c"], "max_tokens": 10}, 30),  # a batch of three prompts
        ({"prompt": [1, 2, 3], "max_tokens": 10}, 10),  # one prompt of token ids
        ({"prompt": [[1, 2], [3]], "max_tokens": 10, "n": 2}, 40),
        ({"messages": [], "max_completion_tokens": 7, "logprobs": True, "top_logprobs": 5}, 42),
        ({"messages": [], "max_tokens": 7, "logprobs": False, "top_logprobs": 5}, 7),  # alternatives off
        ({"prompt": "x"}, 2048),  # max_tokens unset: the model's length
        ({"prompt": "x", "max_tokens": 5, "n": 2, "best_of": 4}, 20),  # best_of generates its candidates
        ({"prompt": "x", "max_tokens": "many", "n": None}, 2048),  # malformed: the parser's to refuse
    ],
)
def test_what_a_request_asks_for(body: dict, asked: int) -> None:
    assert requested_output(body.get, max_model_len=2048) == asked


def test_the_default_limit_is_the_kv_capacity_and_a_plain_request_fits() -> None:
    budget = OutputBudget.for_engine(engine_config(blocks=1000, block_size=16), configured=None)
    assert budget == OutputBudget(limit=16_000, max_model_len=2048)
    assert budget.problem({"prompt": "x"}.get) is None  # one max_model_len sequence always fits
    reason = budget.problem(BOMB.get)
    assert reason is not None and "2,688,000" in reason and "16,000" in reason
    assert OutputBudget.for_engine(engine_config(), configured=10).problem({"prompt": "x", "max_tokens": 11}.get)
    assert OutputBudget(limit=0, max_model_len=2048).problem(BOMB.get) is None  # no capacity known: no limit


# a replica made without __init__ has Serve's async __del__ left unawaited when it is collected
@pytest.mark.filterwarnings("ignore:coroutine 'EBPlusServer.__del__' was never awaited:RuntimeWarning")
def test_the_replica_answers_400_before_the_engine_sees_the_request(monkeypatch: pytest.MonkeyPatch) -> None:
    from ray.serve.llm import LLMServer
    from ray.serve.llm.openai_api_models import ErrorResponse

    from ebplus.replicas.server import EBPlusServer

    engine_calls = []

    async def engine(self, request, raw_request_info=None):
        engine_calls.append(request)

        async def answer():
            yield "generated"

        return answer()

    monkeypatch.setattr(LLMServer, "completions", engine)
    monkeypatch.setattr(LLMServer, "chat", engine)
    server = object.__new__(EBPlusServer)
    server._budget = OutputBudget(limit=10_000, max_model_len=2048)

    async def ask(method: str, request: SimpleNamespace) -> list:
        return [item async for item in await getattr(server, method)(request)]

    (error,) = asyncio.run(ask("completions", SimpleNamespace(**BOMB)))
    assert isinstance(error, ErrorResponse) and error.error.code == 400 and "10,000" in error.error.message
    chat_bomb = SimpleNamespace(messages=[], n=8, max_completion_tokens=1000, logprobs=True, top_logprobs=20)
    (error,) = asyncio.run(ask("chat", chat_bomb))
    assert error.error.code == 400
    assert engine_calls == []
    assert asyncio.run(ask("chat", SimpleNamespace(messages=[], max_tokens=16))) == ["generated"]
    assert len(engine_calls) == 1


def plugin_app(max_request_output: int | None = None, max_body_bytes: int = 4096) -> tuple[TestClient, list]:
    """vLLM's API server as far as the guards see it: the plugin attached, then routes that count their calls."""
    plugin = vllm_plugin.EBPlusEndpoint()
    replicas = {} if max_request_output is None else {"max_request_output": max_request_output}
    config = vllm_plugin.load_settings({"ebplus": {"replicas": replicas, "max_body_bytes": max_body_bytes}})
    plugin.runtime = SimpleNamespace(
        config=config, budget=OutputBudget.for_engine(engine_config(), config.replicas.max_request_output)
    )
    app = FastAPI()
    plugin.attach_router(app)
    reached: list[str] = []

    @app.post("/v1/completions")
    async def completions(request: Request) -> dict:
        reached.append((await request.body()).decode()[:20])
        return {"ok": True}

    @app.post("/v1/audio/transcriptions")
    async def transcriptions(request: Request) -> dict:
        reached.append("audio")
        return {"ok": True}

    return TestClient(app), reached


def test_the_plugin_refuses_a_bomb_before_vllm_parses_it() -> None:
    client, reached = plugin_app()
    r = client.post("/v1/completions", json=BOMB)
    assert r.status_code == 400 and "16,000" in r.json()["error"]["message"]
    assert reached == []
    assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 8}).status_code == 200
    limited, _ = plugin_app(max_request_output=100)
    assert limited.post("/v1/completions", json={"prompt": "hi", "max_tokens": 101}).status_code == 400
    # a form upload is not JSON and is left to vLLM
    files = {"file": ("a.wav", b"RIFF....", "audio/wav")}
    assert client.post("/v1/audio/transcriptions", files=files).status_code == 200
    assert reached[-1] == "audio"


def test_the_plugin_bounds_every_body_before_it_is_read() -> None:
    client, reached = plugin_app(max_body_bytes=4096)
    big = b"x" * 5000
    # the admin write route: FastAPI would read the body in full before its auth dependency
    r = client.put("/admin/overrides", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "4096" in r.json()["error"]["message"]
    assert client.post("/v1/completions", content=big).status_code == 413
    assert reached == []
    with pytest.raises(vllm_plugin.PluginError, match="max_body_bytes"):
        vllm_plugin.load_settings({"ebplus": {"max_body_bytes": 10}})
