"""`ebplus status` over real HTTP: the real admin routes and controller, a stand-in for the OpenAI ingress.

The server is uvicorn on loopback serving ``deploy.admin.router`` over an in-process
:class:`ControllerActor` fed with telemetry (as tests/unit/test_admin_api.py does), plus
a ``/v1/models`` route standing in for Ray's OpenAI ingress (with the API-key rule of
``ApiKeyGuard``). The command runs through ``ebplus.cli.main`` like a user's.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from test_admin_api import TOKEN, feed, make_actor

from ebplus.cli import main
from ebplus.controller.actor import ControllerActor
from ebplus.controller.client import ControllerClient, ControllerUnavailable, LocalTransport
from ebplus.deploy import admin
from ebplus.deploy.auth import Secret
from ebplus.deploy.status import Status, render


def make_app(client: object, api_key: str | None = None) -> FastAPI:
    app = FastAPI()
    app.include_router(admin.router)
    service = admin.AdminService(client, Secret(TOKEN, "test"), "m")
    app.dependency_overrides[admin.get_service] = lambda: service

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        if api_key and request.headers.get("authorization") != f"Bearer {api_key}":
            return JSONResponse({"error": {"message": "invalid API key", "code": 401}}, 401)
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})

    return app


@contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(500):
        if server.started:
            break
        threading.Event().wait(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def actor(tmp_path: Path) -> ControllerActor:
    a = make_actor(tmp_path)
    asyncio.run(feed(a))
    return a


@pytest.fixture
def url(actor: ControllerActor) -> Iterator[str]:
    with serving(make_app(ControllerClient(LocalTransport(actor)))) as base:
        yield base


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_table_shows_what_the_controller_holds(url: str, actor, monkeypatch, capsys) -> None:
    monkeypatch.setenv("EBPLUS_ADMIN_TOKEN", TOKEN)
    asyncio.run(actor.set_override("r0", k=7))
    snap = json.loads(asyncio.run(actor.snapshot()))
    code, out, err = run(["status", "--url", url], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"EB+ Serve at {url}: ok, controller up (version {snap['version']})"
    assert lines[1] == "models: m"
    header = lines[3].split()
    assert header == ["replica", "mode", "active", "k", "N", "theta0", "theta*", "version", "applied", "device"]
    row = dict(zip(header, lines[4].split(maxsplit=len(header) - 1), strict=True))
    r0 = snap["replicas"]["r0"]
    assert row["replica"] == "r0" and row["mode"] == r0["mode"] and row["active"] == r0["active"]
    assert int(row["k"]) == r0["k"] == 7 and int(row["N"]) == r0["n"]
    assert row["theta0"] == f"{r0['theta0']:.3f}" and row["theta*"] == f"{r0['theta_star']:.3f}"
    assert int(row["version"]) == r0["version"] and row["device"] == "NVIDIA H200"
    assert "override r0: k=7" in out
    est = snap["estimate"]
    fleet = next(line for line in lines if line.startswith("fleet:"))
    for value in (f"p0 {est['p0']:.3g}", f"eta {est['eta']:.3g}", f"mu_L {est['mu_l']:.1f}", f"mu_O {est['mu_o']:.1f}"):
        assert value in fleet
    assert f"({est['n_samples']} samples, {snap['updates']} updates, {snap['completions']} completions)" in fleet


def test_json_output(url: str, monkeypatch, capsys) -> None:
    monkeypatch.setenv("EBPLUS_ADMIN_TOKEN", TOKEN)
    code, out, _ = run(["status", "--url", url, "--json"], capsys)
    data = json.loads(out)
    assert code == 0 and data["models"] == ["m"] and "r0" in data["thresholds"]["replicas"]
    assert data["estimates"]["fleet"]["estimate"]["p0"] > 0 and data["problems"] == []


@pytest.mark.parametrize(("token", "needle"), [(None, "an admin token is required"), ("wrong", "token was refused")])
def test_refused_token_is_one_line_exit_2(url: str, monkeypatch, capsys, token: str | None, needle: str) -> None:
    monkeypatch.delenv("EBPLUS_ADMIN_TOKEN", raising=False)
    if token:
        monkeypatch.setenv("EBPLUS_ADMIN_TOKEN", token)
    code, out, err = run(["status", "--url", url], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("ebplus status: error: ") and needle in err and "EBPLUS_ADMIN_TOKEN" in err


def test_token_from_another_env_var(url: str, monkeypatch, capsys) -> None:
    monkeypatch.delenv("EBPLUS_ADMIN_TOKEN", raising=False)
    monkeypatch.setenv("MY_TOKEN", TOKEN)
    assert run(["status", "--url", url, "--token-env", "MY_TOKEN"], capsys)[0] == 0


def test_api_key_for_v1(actor, monkeypatch, capsys) -> None:
    monkeypatch.setenv("EBPLUS_ADMIN_TOKEN", TOKEN)
    monkeypatch.delenv("EBPLUS_API_KEY", raising=False)
    with serving(make_app(ControllerClient(LocalTransport(actor)), api_key="k3y")) as base:
        code, _, err = run(["status", "--url", base], capsys)
        assert code == 2 and "needs an API key: none given" in err and "EBPLUS_API_KEY" in err
        monkeypatch.setenv("EBPLUS_API_KEY", "k3y")
        assert run(["status", "--url", base, "--expect-model", "m"], capsys)[0] == 0


class DeadTransport:
    async def call(self, method: str, *args, **kwargs):
        raise ControllerUnavailable("gone")


def test_controller_down_is_degraded_exit_1(monkeypatch, capsys) -> None:
    monkeypatch.setenv("EBPLUS_ADMIN_TOKEN", TOKEN)
    with serving(make_app(ControllerClient(DeadTransport()))) as base:
        code, out, _ = run(["status", "--url", base], capsys)
    assert code == 1
    assert "controller DOWN" in out.splitlines()[0]
    assert "problem: the controller does not answer" in out
    assert "problem: /admin/thresholds answered 503: controller unavailable (restarting, paused or gone); retry" in out


def test_expect_model_missing_is_exit_1(url: str, monkeypatch, capsys) -> None:
    monkeypatch.setenv("EBPLUS_ADMIN_TOKEN", TOKEN)
    code, out, _ = run(["status", "--url", url, "--expect-model", "qwen3-8b"], capsys)
    assert code == 1 and "problem: model 'qwen3-8b' is not served (served: m)" in out


def test_unreachable_is_one_line_exit_2(capsys) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, out, err = run(["status", "--url", f"http://127.0.0.1:{port}", "--timeout", "2"], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"cannot reach http://127.0.0.1:{port}/health" in err


def test_not_an_ebplus_endpoint(capsys) -> None:
    app = FastAPI()
    with serving(app) as base:
        code, _, err = run(["status", "--url", base], capsys)
    assert code == 2 and "/health answered 404" in err


def test_render_before_any_replica_registered() -> None:
    status = Status(
        url="http://x", health={"status": "ok", "controller": True, "version": 0}, models=["m"],
        thresholds={"version": 0, "replicas": {}, "overrides": {}},
        estimates={"fleet": {"estimate": None, "first_estimate": None, "updates": 0, "completions": 0}},
    )  # fmt: skip
    text = render(status)
    assert "no replicas have registered with the controller yet" in text
    assert "fleet:  p0 -  eta -  mu_L -  mu_O -   (- samples, 0 updates, 0 completions)" in text
