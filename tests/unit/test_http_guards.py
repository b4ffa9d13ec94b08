"""deploy/middleware.py and deploy/auth.py: body limits, API key, secrets never shown."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from fastapi.testclient import TestClient

from deploy.auth import Secret, bearer_token, load_secret
from deploy.middleware import ApiKeyGuard, BodySizeLimit


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


@pytest.mark.parametrize(
    ("header", "token"),
    [("Bearer abc", "abc"), ("bearer abc", "abc"), ("Basic abc", None), ("Bearer ", None), (None, None), ("abc", None)],
)
def test_bearer_token_parsing(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token
