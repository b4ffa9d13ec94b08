"""deploy/middleware.py and deploy/auth.py: body limits, API key, secrets never shown."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from fastapi.testclient import TestClient

from ebplus.deploy.auth import Secret, bearer_token, load_secret
from ebplus.deploy.config import AuthSection
from ebplus.deploy.middleware import ApiKeyGuard, BodySizeLimit


def app_with(key: str | None, max_bytes: int = 1024) -> TestClient:
    app = FastAPI()

    @app.post("/v1/echo")
    async def echo(request: Request) -> dict:
        return {"n": len(await request.body())}

    @app.get("/v1/stream")
    async def stream() -> StreamingResponse:
        return StreamingResponse(iter([b"a", b"b", b"c"]), media_type="text/event-stream")

    @app.get("/health")
    async def health() -> dict:
        return {"ok": True}

    app.add_middleware(ApiKeyGuard, key=Secret(key, "test"))
    app.add_middleware(BodySizeLimit, max_bytes=max_bytes)
    return TestClient(app)


def test_body_limit_by_header_and_by_stream() -> None:
    c = app_with(None, max_bytes=100)
    assert c.post("/v1/echo", content=b"x" * 100).json() == {"n": 100}
    r = c.post("/v1/echo", content=b"x" * 101)
    assert r.status_code == 413 and "exceeds 100 bytes" in r.json()["error"]["message"]

    def chunks():  # no content-length: chunked upload
        for _ in range(5):
            yield b"y" * 30

    assert c.post("/v1/echo", content=chunks()).status_code == 413


def test_api_key_enforced_on_v1_only() -> None:
    c = app_with("key-1")
    assert c.post("/v1/echo", content=b"{}").status_code == 401
    assert c.post("/v1/echo", content=b"{}", headers={"Authorization": "Bearer key-2"}).status_code == 401
    assert c.post("/v1/echo", content=b"{}", headers={"Authorization": "Bearer key-1"}).status_code == 200
    assert c.get("/health").status_code == 200
    r = c.get("/v1/stream", headers={"Authorization": "Bearer key-1"})
    assert r.status_code == 200 and r.text == "abc"


def test_no_api_key_means_open_v1() -> None:
    assert app_with(None).post("/v1/echo", content=b"{}").status_code == 200


def test_secret_sources_and_redaction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("T_ENV", " from-env \n")
    s = load_secret("T_ENV", None)
    assert s.value == "from-env" and s.matches("from-env") and not s.matches("from-env ")
    assert "from-env" not in repr(s) and "from-env" not in str(s)
    f = tmp_path / "tok"
    f.write_text("from-file\n")
    assert load_secret("T_ENV", str(f)).value == "from-file"
    assert not load_secret("UNSET_VAR_XYZ", None).configured
    assert not Secret(None, "x").matches("")
    with pytest.raises(ValueError, match="cannot read secret file"):
        load_secret("T_ENV", str(tmp_path / "missing"))



def test_an_empty_secret_file_fails_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty admin_token_file yielded no secret: /admin reads open, as if none were configured."""
    empty = tmp_path / "token"
    empty.write_text("\n")
    monkeypatch.setenv("T_ENV", "from-env")  # the file wins: an empty one does not fall back either
    with pytest.raises(ValueError, match=f"secret file {empty} is empty"):
        load_secret("T_ENV", str(empty))


def test_check_names_an_unusable_secret_file_and_notes_a_missing_secret(tmp_path: Path) -> None:
    from ebplus.deploy.check import check_auth
    from ebplus.deploy.config import parse_config

    (tmp_path / "token").write_text("")
    cfg = parse_config({"auth": {"admin_token_file": str(tmp_path / "token"), "api_key_file": str(tmp_path / "nope")}})
    found = {f.field: (f.error, f.message) for f in check_auth(cfg, {})}
    assert found["auth.admin_token_file"] == (True, f"secret file {tmp_path / 'token'} is empty")
    assert found["auth.api_key_file"][0] and "cannot read secret file" in found["auth.api_key_file"][1]
    notes = {f.field: f for f in check_auth(parse_config({}), {"EBPLUS_ADMIN_TOKEN": "t"})}
    assert list(notes) == ["auth.api_key_env"] and not notes["auth.api_key_env"].error


@pytest.mark.parametrize(
    ("header", "token"),
    [("Bearer abc", "abc"), ("bearer abc", "abc"), ("Basic abc", None), ("Bearer ", None), (None, None), ("abc", None)],
)
def test_bearer_token_parsing(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


# -- hostile bodies and error answers (issue #7) ------------------------------------


def guarded_app() -> TestClient:
    from fastapi.responses import PlainTextResponse

    from ebplus.deploy.middleware import ErrorResponses, JsonBodyGuard

    app = FastAPI()

    @app.post("/v1/echo")
    async def echo(request: Request) -> dict:
        return {"n": len(await request.body())}

    @app.post("/admin/echo")
    async def admin_echo(request: Request) -> dict:
        return {"n": len(await request.body())}

    @app.get("/busy")
    async def busy() -> PlainTextResponse:  # what Ray Serve answers over max_queued_requests
        return PlainTextResponse("Request dropped due to backpressure (num_queued_requests=8, max_queued_requests=8).", 503)

    @app.get("/crash")
    async def crash() -> PlainTextResponse:
        return PlainTextResponse('Traceback: File "/srv/secret/path.py", pid=1234', 500, headers={"x-request-id": "r-1"})

    @app.get("/slow-down")
    async def slow_down() -> PlainTextResponse:
        return PlainTextResponse("later", 429, headers={"Retry-After": "7"})

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        return StreamingResponse(iter([b"data: 1\n\n", b"data: [DONE]\n\n"]), media_type="text/event-stream")

    app.add_middleware(JsonBodyGuard)
    app.add_middleware(ErrorResponses)
    return TestClient(app, raise_server_exceptions=False)


@pytest.mark.parametrize(
    ("body", "content_type", "status", "needle"),
    [
        (b'{"prompt": "\\ud800"}', "application/json", 400, "lone UTF-16 surrogate"),
        (b'{"prompt": ["ok", {"k": "\\udfff"}]}', "application/json", 400, "lone UTF-16 surrogate"),
        (b'{"prompt": "\xff\xfe"}', "application/json", 400, "not valid UTF-8"),
        (b'{"max_tokens": 1e400}', "application/json", 400, "out of range"),
        (b'{"temperature": NaN}', "application/json", 400, "NaN is not a JSON number"),
        (b'{"temperature": -Infinity}', "application/json", 400, "-Infinity is not a JSON number"),
        (b"model=tiny", "application/x-www-form-urlencoded", 415, "must be application/json"),
        (b"\xff\xfe", "text/plain", 415, "must be application/json"),
    ],
)
def test_bodies_the_stack_would_choke_on_are_4xx_with_a_reason(
    body: bytes, content_type: str, status: int, needle: str
) -> None:
    c = guarded_app()
    r = c.post("/v1/echo", content=body, headers={"content-type": content_type})
    assert r.status_code == status and needle in r.json()["error"]["message"], r.text
    r = c.post("/admin/echo", content=body, headers={"content-type": content_type})
    assert r.status_code == (422 if status == 400 else status) and needle in r.json()["detail"][0]["msg"], r.text


@pytest.mark.parametrize("headers", [{}, {"content-type": ""}, {"content-type": " ; charset=utf-8"}])
def test_a_body_without_a_content_type_is_415(headers: dict[str, str]) -> None:
    """A JSON body with no Content-Type (or an empty one) is refused with a reason: passed on, vLLM's routes
    answered it 500 on the live deployment (``make bench-hostile``'s malformed headers)."""
    c = guarded_app()
    r = c.post("/v1/echo", content=b'{"model": "m", "prompt": "hi"}', headers=headers)
    assert r.status_code == 415 and "got no type" in r.json()["error"]["message"], r.text


@pytest.mark.parametrize(
    "body",
    [
        b'{"prompt": "\\ud83d\\ude00 paired surrogates are fine"}',
        b'{"prompt": "a literal backslash-u: \\\\ud800"}',
        b'{"prompt": "\xc3\xa9t\xc3\xa9", "max_tokens": 1e3}',
        b"{not json",  # syntax errors are the application's to answer
        b"",
    ],
)
def test_valid_or_syntax_error_bodies_pass_through(body: bytes) -> None:
    r = guarded_app().post("/v1/echo", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 200 and r.json() == {"n": len(body)}


def test_back_pressure_gets_retry_after_and_json() -> None:
    c = guarded_app()
    r = c.get("/busy")
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["message"].startswith("Request dropped due to backpressure")
    r = c.get("/slow-down")
    assert r.status_code == 429 and r.headers["retry-after"] == "7"  # an existing value is kept


def test_server_errors_do_not_leak_internals() -> None:
    r = guarded_app().get("/crash")
    assert r.status_code == 500
    assert "/srv/secret" not in r.text and "pid" not in r.text
    assert r.json()["error"]["message"] == "internal error (request id r-1); the server log has the details"


def test_streams_pass_through_the_error_filter() -> None:
    r = guarded_app().get("/stream")
    assert r.status_code == 200 and r.text == "data: 1\n\ndata: [DONE]\n\n"


def test_full_ingress_app_refuses_hostile_bodies_before_the_handlers() -> None:
    """The same on the real app (Ray's OpenAI app + /admin); these were 500s on the live deployment."""
    from ebplus.deploy.ingress import make_app

    c = TestClient(make_app(1 << 20, AuthSection(api_key_env="EBPLUS_TEST_UNSET_KEY")))
    r = c.post("/v1/completions", content=b'{"model": "m", "prompt": "\\ud800"}', headers={"content-type": "application/json"})
    assert r.status_code == 400 and "surrogate" in r.json()["error"]["message"]
    r = c.put("/admin/overrides", content=b"\xff", headers={"content-type": "text/plain"})
    assert r.status_code == 415
    r = c.put("/admin/overrides", content=b'{"replica": "*", "k": 1e400}', headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body"]


def test_no_cross_origin_access_unless_allowed() -> None:
    """Ray's app echoed any Origin with credentials allowed: any web page could read /admin, /metrics, /v1."""
    from ebplus.deploy.ingress import make_app

    auth = AuthSection(api_key_env="EBPLUS_TEST_UNSET_KEY")
    evil = {"origin": "https://evil.example", "access-control-request-method": "GET"}
    closed = TestClient(make_app(1 << 20, auth))
    for r in (closed.get("/metrics", headers=evil), closed.options("/admin/thresholds", headers=evil)):
        assert "access-control-allow-origin" not in r.headers and "access-control-allow-credentials" not in r.headers
    allowed = TestClient(make_app(1 << 20, auth, ["https://app.example"]))
    ok = allowed.get("/metrics", headers={"origin": "https://app.example"})
    assert ok.headers["access-control-allow-origin"] == "https://app.example"
    assert "access-control-allow-origin" not in allowed.get("/metrics", headers=evil).headers


@pytest.mark.parametrize("chunks_before", [0, 2])
def test_replica_death_becomes_a_503_error_not_a_500_or_a_cut_stream(monkeypatch: pytest.MonkeyPatch, chunks_before: int) -> None:
    """The ingress turns ActorDiedError under a request into an OpenAI error with code 503.

    Before the first chunk Ray's ingress answers it as a 503 response (retryable); after it, the
    stream carries an error event. The live fault is in tests/e2e/test_reliability.py.
    """
    import asyncio

    from ray.exceptions import ActorDiedError
    from ray.llm._internal.serve.core.configs.openai_api_models import ErrorResponse
    from ray.llm._internal.serve.core.ingress import ingress as ray_ingress

    from ebplus.deploy.ingress import EBPlusIngress

    async def dying(self, **kwargs):
        for i in range(chunks_before):
            yield f"chunk {i}"
        raise ActorDiedError()

    monkeypatch.setattr(ray_ingress.OpenAiIngress, "_get_response", dying)

    async def collect() -> list:
        ingress = object.__new__(EBPlusIngress)
        ingress._stall_timeout_s, ingress._progress_timeout_s = 5.0, None
        return [r async for r in ingress._get_response(body=None, call_method="completions")]

    out = asyncio.run(collect())
    assert out[:chunks_before] == [f"chunk {i}" for i in range(chunks_before)]
    (err,) = out[chunks_before:]
    assert isinstance(err, ErrorResponse) and err.error.code == 503 and "retry" in err.error.message


def _failing_stream(monkeypatch: pytest.MonkeyPatch, chunks_before: int, exc: BaseException) -> list:
    """What the EB+ ingress answers when the replica's stream raises ``exc`` after ``chunks_before`` chunks,
    as the client gets it: through Ray's SSE wrapper (which adds ``[DONE]`` once the stream ends)."""
    import asyncio

    from ray.llm._internal.serve.core.ingress import ingress as ray_ingress
    from ray.llm._internal.serve.core.ingress.utils import _openai_json_wrapper

    from ebplus.deploy.ingress import EBPlusIngress

    async def failing(self, **kwargs):
        for i in range(chunks_before):
            yield f"data: chunk {i}\n\n"
        raise exc

    monkeypatch.setattr(ray_ingress.OpenAiIngress, "_get_response", failing)

    async def collect() -> list:
        ingress = object.__new__(EBPlusIngress)
        ingress._stall_timeout_s, ingress._progress_timeout_s = 5.0, None
        return [r async for r in _openai_json_wrapper(ingress._get_response(body=None, call_method="completions"))]

    return asyncio.run(collect())


def _task_error() -> BaseException:
    """A ``RayTaskError``: an exception raised inside the replica (an engine error), as the caller receives it."""
    from ray.exceptions import RayTaskError

    try:
        raise RuntimeError("engine exploded at /secret/path pid=1234")
    except RuntimeError as cause:
        return RayTaskError("completions", "Traceback ... /secret/path", cause)


@pytest.mark.parametrize(
    ("make_exc", "code"),
    [
        (_task_error, 500),
        (lambda: __import__("ray.exceptions").exceptions.ObjectLostError("ab" * 14, "owner", "call"), 503),
        (lambda: __import__("ray.exceptions").exceptions.ActorUnavailableError("gone", None), 503),
    ],
    ids=["RayTaskError", "ObjectLostError", "ActorUnavailableError"],
)
def test_every_failure_mid_stream_ends_with_an_error_event_and_done(
    monkeypatch: pytest.MonkeyPatch, make_exc, code: int
) -> None:
    import json

    out = _failing_stream(monkeypatch, 2, make_exc())
    assert out[:2] == ["data: chunk 0\n\n", "data: chunk 1\n\n"]
    event, done = out[2:]
    error = json.loads(event.removeprefix("data: "))["error"]
    assert error["code"] == code and "/secret/path" not in error["message"] and "pid" not in error["message"]
    assert done == "data: [DONE]\n\n"


def test_a_failure_before_the_first_chunk_is_an_error_response_and_routing_errors_pass_through(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ray.serve.exceptions import BackPressureError
    from starlette.exceptions import HTTPException

    (event, done) = _failing_stream(monkeypatch, 0, _task_error())
    assert '"code":500' in event.replace(" ", "") and done == "data: [DONE]\n\n"
    with pytest.raises(HTTPException):  # the stock ingress' 404 for an unknown model stays a 404
        _failing_stream(monkeypatch, 0, HTTPException(404, "no such model"))
    with pytest.raises(BackPressureError):  # Serve's proxy answers back-pressure with its 503
        _failing_stream(monkeypatch, 0, BackPressureError(num_queued_requests=5, max_queued_requests=4))


def test_a_stuck_stream_is_a_504_event_within_the_progress_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio
    import time

    from ray.llm._internal.serve.core.configs.openai_api_models import ErrorResponse
    from ray.llm._internal.serve.core.ingress import ingress as ray_ingress

    from ebplus.deploy.ingress import EBPlusIngress
    from ebplus.replicas.heartbeat import HEARTBEAT

    async def wedged(self, **kwargs):
        yield HEARTBEAT
        yield "data: chunk 0\n\n"
        while True:  # alive, but the engine does not move
            await asyncio.sleep(0.05)
            yield HEARTBEAT

    monkeypatch.setattr(ray_ingress.OpenAiIngress, "_get_response", wedged)

    async def collect() -> tuple[list, float]:
        ingress = object.__new__(EBPlusIngress)
        ingress._stall_timeout_s, ingress._progress_timeout_s = 1.0, 0.3
        started = time.monotonic()
        out = [r async for r in ingress._get_response(body=None, call_method="chat")]
        return out, time.monotonic() - started

    out, took = asyncio.run(collect())
    assert out[0] == "data: chunk 0\n\n" and took < 2.0
    (err,) = out[1:]
    assert isinstance(err, ErrorResponse) and err.error.code == 504


@pytest.mark.parametrize("chunks_before", [0, 2])
def test_a_silent_replica_becomes_a_503_within_the_stall_deadline(monkeypatch: pytest.MonkeyPatch, chunks_before: int) -> None:
    """A replica on a lost node may say nothing until Ray declares the node dead: the ingress asks for
    heartbeats (the *_with_heartbeats methods) and gives up on a stream silent for stall_timeout_s."""
    import asyncio
    import time

    from ray.llm._internal.serve.core.configs.openai_api_models import ErrorResponse
    from ray.llm._internal.serve.core.ingress import ingress as ray_ingress

    from ebplus.deploy.ingress import EBPlusIngress
    from ebplus.replicas.heartbeat import HEARTBEAT

    called = []

    async def silent(self, **kwargs):
        called.append(kwargs["call_method"])
        yield HEARTBEAT  # the replica took the request ...
        for i in range(chunks_before):
            yield f"chunk {i}"
        await asyncio.sleep(3600)  # ... then its node is lost: nothing more, not even a heartbeat

    monkeypatch.setattr(ray_ingress.OpenAiIngress, "_get_response", silent)

    async def collect() -> tuple[list, float]:
        ingress = object.__new__(EBPlusIngress)
        ingress._stall_timeout_s, ingress._progress_timeout_s = 0.3, None
        started = time.monotonic()
        out = [r async for r in ingress._get_response(body=None, call_method="chat")]
        return out, time.monotonic() - started

    out, took = asyncio.run(collect())
    assert called == ["chat_with_heartbeats"] and took < 2.0
    assert out[:chunks_before] == [f"chunk {i}" for i in range(chunks_before)]  # the heartbeat never reaches the client
    (err,) = out[chunks_before:]
    assert isinstance(err, ErrorResponse) and err.error.code == 503 and "retry" in err.error.message


def test_api_key_also_guards_the_tokenizer_routes() -> None:
    """/tokenize and /detokenize run the model's tokenizer: they need the key like /v1."""
    app = FastAPI()

    @app.post("/tokenize")
    async def tokenize() -> dict:
        return {"tokens": [1]}

    app.add_middleware(ApiKeyGuard, key=Secret("key-1", "test"))
    c = TestClient(app)
    assert c.post("/tokenize", json={}).status_code == 401
    assert c.post("/tokenize", json={}, headers={"Authorization": "Bearer key-1"}).status_code == 200


def test_request_fan_out_is_bounded_by_the_engine() -> None:
    """n and the prompts per request are capped at max_num_seqs (vLLM: 16,384 and 1,024 by default)."""
    from ebplus.deploy.app import engine_env, request_limits
    from ebplus.deploy.config import parse_config

    cfg = parse_config({"engine": {"max_num_seqs": 48}})
    assert request_limits(cfg) == {"VLLM_MAX_N_SEQUENCES": "48", "VLLM_MAX_COMPLETION_PROMPTS": "48"}
    assert engine_env(cfg)["VLLM_MAX_N_SEQUENCES"] == "48"


def test_token_comparison_is_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every credential check goes through hmac.compare_digest (no early exit on the first wrong byte)."""
    import hmac

    from ebplus.deploy import auth

    calls = []
    real = hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    secret = Secret("s3cret", "test")
    assert secret.matches("s3cret") and not secret.matches("s3creX") and not secret.matches("x")
    assert calls == [(b"s3cret", b"s3cret"), (b"s3cret", b"s3creX"), (b"s3cret", b"x")]
    c = app_with("key-1")  # the /v1 guard uses the same comparison
    calls.clear()
    assert c.post("/v1/echo", content=b"{}", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert calls == [(b"key-1", b"nope")]


@pytest.mark.parametrize(
    "body",
    [
        {"messages": None},
        {"messages": 5},
    ],
)
def test_a_body_that_crashes_a_validator_is_400_not_500(body: dict) -> None:
    """vLLM's own ChatCompletionRequest raises TypeError in before-validators on these shapes (500s found by
    schemathesis on the live deployment); the ingress answers them 400 with the reason."""
    from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionRequest

    from ebplus.deploy.ingress import install_body_crash_handlers

    app = FastAPI()

    async def chat(request: ChatCompletionRequest) -> dict:
        return {"ok": True}

    chat.__annotations__["request"] = ChatCompletionRequest  # a real class, not this module's string annotation
    app.post("/v1/chat/completions")(chat)

    @app.get("/v1/bug")
    async def bug() -> dict:
        raise TypeError("a bug in a handler is still a 500")

    install_body_crash_handlers(app)
    c = TestClient(app, raise_server_exceptions=False)
    r = c.post("/v1/chat/completions", json={"model": "m", **body})
    assert r.status_code == 400 and "unexpected shape" in r.json()["error"]["message"], r.text
    ok = c.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert ok.json() == {"ok": True}
    assert c.get("/v1/bug").status_code == 500


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": [None]},
        {"role": "user", "content": [5]},
        {"author": {"role": "assistant"}, "content": [{"type": "text", "text": "hi"}]},  # harmony's shape
    ],
)
def test_chat_messages_of_the_wrong_shape_are_400_not_500(monkeypatch: pytest.MonkeyPatch, message: dict) -> None:
    """These pass parsing and used to fail further on (Ray's sanitiser, the replica's renderer) as 500s."""
    import asyncio

    from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionRequest, ErrorResponse
    from ray.llm._internal.serve.core.ingress import ingress as ray_ingress

    from ebplus.deploy.ingress import EBPlusIngress

    async def must_not_run(self, **kwargs):
        raise AssertionError("the request should not reach a replica")
        yield

    monkeypatch.setattr(ray_ingress.OpenAiIngress, "_get_response", must_not_run)
    body = ChatCompletionRequest.model_validate({"model": "m", "messages": [message]})

    async def collect() -> list:
        return [r async for r in object.__new__(EBPlusIngress)._get_response(body=body, call_method="chat")]

    (err,) = asyncio.run(collect())
    assert isinstance(err, ErrorResponse) and err.error.code == 400 and "invalid request" in err.error.message


def test_replicas_start_with_the_configured_cold_theta() -> None:
    """Before the controller's first reply a replica runs k = floor(theta_cold * N) of *this* config:
    the deployment's sections reach the scheduler through vLLM's additional_config."""
    from ebplus.deploy.app import engine_kwargs
    from ebplus.deploy.config import parse_config
    from ebplus.replicas import settings

    def start_k(data: dict) -> int:
        engine = settings.load(engine_kwargs(parse_config(data))["additional_config"], env={"EBPLUS_K": "3"})
        return engine.scheduler.initial(64, engine.theta_cold).k

    assert start_k({"engine": {"max_num_seqs": 64}, "controller": {"planner": {"theta_cold": 0.25}}}) == 16
    assert start_k({"engine": {"max_num_seqs": 64}, "scheduler": {"n": 40}}) == 4  # default theta_cold 0.10 of 40
    assert start_k({"engine": {"max_num_seqs": 64}, "scheduler": {"k": 7}}) == 7  # an explicit k wins
