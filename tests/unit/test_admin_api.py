"""Admin REST API over a real in-process ControllerActor: auth, validation, views, persistence."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from factories import batch, registration
from fastapi import FastAPI
from fastapi.testclient import TestClient

from ebplus.controller.actor import ControllerActor
from ebplus.controller.client import ControllerClient, ControllerUnavailable, LocalTransport
from ebplus.controller.config import ControllerConfig
from ebplus.controller.cost_model import CostModel
from ebplus.controller.messages import CompletionRecord, FinishReason, StepRecord, encode
from ebplus.deploy import admin
from ebplus.deploy.auth import Secret
from ebplus.deploy.config import AuthSection

TOKEN = "s3cret-token"
H200 = CostModel(
    alpha_p=1.2786e-3, beta_p=2.4853e-5, alpha_d=8.921e-3, beta_d=4.586e-5, beta_mb=(2.494e-5, 5.193e-5, 1.478e-5)
)


def make_actor(state_dir: Path) -> ControllerActor:
    return ControllerActor(ControllerConfig(update_every=100, state_dir=str(state_dir)), housekeeping=False)


def make_client(actor: ControllerActor, token: str | None) -> TestClient:
    app = FastAPI()
    app.include_router(admin.router)
    service = admin.AdminService(ControllerClient(LocalTransport(actor)), Secret(token, "test"), "m")
    app.dependency_overrides[admin.get_service] = lambda: service
    return TestClient(app)


async def feed(actor: ControllerActor, rounds: int = 2) -> None:
    await actor.register(encode(registration("r0", "auto", 2_000_000, 1024, H200, "NVIDIA H200")))
    rng = np.random.default_rng(0)
    for _ in range(rounds):
        comps = [CompletionRecord(512, int(o), FinishReason.STOP) for o in rng.geometric(1 / 256, 100)]
        await actor.ingest(batch("r0", comps, [StepRecord(0, 900, 900, 400, 0.04)]))


@pytest.fixture
def actor(tmp_path: Path) -> ControllerActor:
    import asyncio

    a = make_actor(tmp_path)
    asyncio.run(feed(a))
    return a


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_reads_need_token_when_configured(actor) -> None:
    c = make_client(actor, TOKEN)
    assert c.get("/admin/thresholds").status_code == 401
    assert c.get("/admin/thresholds", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert c.get("/admin/thresholds", headers={"Authorization": TOKEN}).status_code == 401
    r = c.get("/admin/thresholds", headers=AUTH)
    assert r.status_code == 200
    body = r.json()
    rep = body["replicas"]["r0"]
    for key in ("mode", "k", "n", "theta0", "delta_theta", "theta_star", "version", "applied_version", "updated_at"):
        assert key in rep
    assert rep["version"] == body["version"] == 2 and rep["device"] == "NVIDIA H200"


def test_without_token_reads_work_and_mutations_are_403(actor) -> None:
    c = make_client(actor, None)
    assert c.get("/admin/estimates").status_code == 200
    for method, path, kw in (
        ("put", "/admin/overrides", {"json": {"replica": "r0", "k": 3}}),
        ("delete", "/admin/overrides/r0", {}),
        ("post", "/admin/recompute", {}),
    ):
        r = getattr(c, method)(path, headers=AUTH, **kw)
        assert r.status_code == 403 and "no admin token is configured" in r.json()["detail"]


def test_estimates_shape(actor) -> None:
    body = make_client(actor, TOKEN).get("/admin/estimates", headers=AUTH).json()
    for key in ("p0", "eta", "mu_l", "mu_o", "n_samples", "method"):
        assert body["fleet"]["estimate"][key] is not None
    assert body["fleet"]["updates"] == 2 and body["fleet"]["completions"] == 200
    assert set(body["replicas"]["r0"]["cost_model"]) >= {"alpha_p", "beta_p", "alpha_d", "beta_d", "beta_mb"}


def test_override_roundtrip_and_history(actor) -> None:
    c = make_client(actor, TOKEN)
    r = c.put("/admin/overrides", headers=AUTH, json={"replica": "r0", "mode": "eb", "k": 7, "ttl_s": 60})
    assert r.status_code == 200, r.text
    th = c.get("/admin/thresholds", headers=AUTH).json()
    assert th["replicas"]["r0"]["k"] == 7 and th["replicas"]["r0"]["mode"] == "eb"
    assert th["overrides"]["r0"]["k"] == 7
    hist = c.get("/admin/history?limit=1", headers=AUTH).json()["decisions"]
    assert len(hist) == 1 and hist[0]["cause"] == "override r0" and hist[0]["override"]["k"] == 7
    assert c.delete("/admin/overrides/r0", headers=AUTH).status_code == 200
    assert c.delete("/admin/overrides/r0", headers=AUTH).status_code == 404
    assert c.get("/admin/thresholds", headers=AUTH).json()["replicas"]["r0"]["mode"] == "auto"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"replica": "r0", "k": 0}, "k"),
        ({"replica": "r0", "k": 2000}, "k"),
        ({"replica": "r0", "n": 5000}, "n"),
        ({"replica": "ghost", "k": 3}, "replica"),
        ({"replica": "r0", "mode": "turbo"}, "mode"),
        ({"replica": "r0", "k": "many"}, "k"),
        ({"replica": "r0", "ttl_s": -5, "k": 2}, "ttl_s"),
        ({"replica": "r0", "k": 2, "colour": "red"}, "colour"),
        ({"k": 2}, "replica"),
    ],
)
def test_invalid_overrides_are_422_naming_the_field(actor, body: dict, field: str) -> None:
    c = make_client(actor, TOKEN)
    before = c.get("/admin/thresholds", headers=AUTH).json()
    r = c.put("/admin/overrides", headers=AUTH, json=body)
    assert r.status_code == 422
    assert any(err["loc"][-1] == field for err in r.json()["detail"]), r.json()
    assert c.get("/admin/thresholds", headers=AUTH).json() == before


def test_recompute_bumps_version(actor) -> None:
    c = make_client(actor, TOKEN)
    v = c.get("/admin/thresholds", headers=AUTH).json()["version"]
    r = c.post("/admin/recompute", headers=AUTH)
    assert r.status_code == 200 and r.json()["version"] == v + 1


def test_history_limit_validated(actor) -> None:
    c = make_client(actor, TOKEN)
    assert c.get("/admin/history?limit=0", headers=AUTH).status_code == 422
    assert c.get("/admin/history?limit=abc", headers=AUTH).status_code == 422


def test_metrics_and_admin_agree(actor) -> None:
    c = make_client(actor, TOKEN)
    text = c.get("/metrics").text
    th = c.get("/admin/thresholds", headers=AUTH).json()["replicas"]["r0"]
    assert f'ebplus_threshold_k{{ReplicaId="r0",model="m",model_name="m",replica="r0"}} {float(th["k"])}' in text
    assert "ebplus_controller_up 1.0" in text


class DeadTransport:
    async def call(self, method: str, *args, **kwargs):
        # the first line of a Ray error, as RayTransport passes it on
        raise ControllerUnavailable("ActorDiedError: The actor died unexpectedly. pid=4242, ip=10.1.2.3, actor_id=9f3a")


def test_controller_unavailable_is_503_with_retry_after() -> None:
    app = FastAPI()
    app.include_router(admin.router)
    app.dependency_overrides[admin.get_service] = lambda: admin.AdminService(ControllerClient(DeadTransport()), Secret(None, "t"), "m")
    c = TestClient(app)
    r = c.get("/admin/thresholds")
    assert r.status_code == 503 and r.headers["retry-after"] == "2"
    assert not [w for w in ("pid=", "ip=", "actor_id", "10.1.2.3") if w in r.text], r.text  # the log has them
    assert c.get("/metrics").text.strip().endswith("ebplus_controller_up 0.0")
    assert c.get("/health").json() == {"status": "ok", "controller": False, "version": None}


def test_state_survives_actor_restart(tmp_path: Path) -> None:
    import asyncio

    a = make_actor(tmp_path)
    asyncio.run(feed(a, rounds=3))
    asyncio.run(a.set_override("r0", k=4))
    before = asyncio.run(ControllerClient(LocalTransport(a)).snapshot())
    b = make_actor(tmp_path)  # what Ray does on restart: same args, fresh process
    assert b.restored
    asyncio.run(b.register(encode(registration("r0", "auto", 2_000_000, 1024, H200, "NVIDIA H200"))))
    after = asyncio.run(ControllerClient(LocalTransport(b)).snapshot())
    assert after.version == before.version
    assert after.replicas["r0"].k == 4 and after.estimate == before.estimate


def test_full_ingress_app_keeps_422_for_admin(actor) -> None:
    """Ray's OpenAI app maps validation errors to 400; /admin must still answer 422 with the field."""
    from ebplus.deploy.ingress import make_app

    app = make_app(1 << 20, AuthSection(api_key_env="EBPLUS_TEST_UNSET_KEY"))
    service = admin.AdminService(ControllerClient(LocalTransport(actor)), Secret(TOKEN, "test"), "m")
    app.dependency_overrides[admin.get_service] = lambda: service
    r = TestClient(app).put("/admin/overrides", headers=AUTH, json={"replica": "r0", "k": 0})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "k"]
