"""The controller as a real Ray actor: named lookup, telemetry round trip, restart with resumed state."""

from __future__ import annotations

import time

import pytest
from ebplus.bench.reliability import wait_until
from ebplus.controller.actor import ACTOR_NAME, NAMESPACE, get_controller, start_controller
from ebplus.controller.cost_model import CostModel
from ebplus.controller.telemetry import CompletionRecord, FinishReason, StepRecord, TelemetryBatch

pytestmark = pytest.mark.e2e

PRIOR = CostModel(alpha_p=1e-3, beta_p=1e-5, alpha_d=1e-2, beta_d=1e-5, beta_mb=(1e-5, 0.0, 0.0)).model_dump()


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=1, include_dashboard=False, namespace=NAMESPACE, log_to_driver=False)
    yield ray
    ray.shutdown()


def batch(i: int) -> TelemetryBatch:
    comps = tuple(CompletionRecord(100, 5 + (i + j) % 40, FinishReason.STOP) for j in range(20))
    return TelemetryBatch("r0", comps, (StepRecord(0, 10, 10, 30, 0.02),), applied_version=i)


def wait_for_restart(ray, old_pid: int, timeout_s: float = 60.0) -> dict:
    """Ping until a *new* actor process answers.

    ``ray.kill`` returns before the kill lands: a ping sent right after it can
    still be served by the dying process, which was never restored.
    """

    def restarted() -> dict | None:
        ping = ray.get(get_controller().ping.remote(), timeout=5)
        return ping if ping["pid"] != old_pid else None

    return wait_until(f"a new controller process (the old pid was {old_pid})", restarted, timeout_s)


@pytest.mark.timeout(180)
def test_named_actor_restarts_and_resumes(ray_local) -> None:
    ray = ray_local
    handle = start_controller({"update_every": 10, "min_samples": 10, "first_update": 10}, persist_every_s=0.2)
    assert start_controller() is not None  # get_if_exists: the same actor, not a second one
    assert ray.get_actor(ACTOR_NAME, namespace=NAMESPACE)._actor_id == handle._actor_id

    first = ray.get(handle.register.remote("r0", "auto", 100_000, 64, PRIOR, "cpu"))
    assert first["version"] == 0
    for i in range(5):
        reply = ray.get(handle.ingest.remote(batch(i)))
    assert reply["version"] == 5  # an update per batch once 10 completions arrived
    before = ray.get(handle.snapshot.remote())

    old_pid = ray.get(handle.ping.remote())["pid"]
    time.sleep(0.5)  # let the housekeeping loop persist
    ray.kill(handle, no_restart=False)
    ping = wait_for_restart(ray, old_pid)
    assert ping["restored"], ping
    assert ping["version"] == before["version"]

    again = ray.get(get_controller().register.remote("r0", "auto", 100_000, 64, PRIOR, "cpu"))
    assert {k: again[k] for k in ("k", "n", "active", "version")} == {
        k: before["replicas"]["r0"][k] for k in ("k", "n", "active", "version")
    }
    after = ray.get(get_controller().snapshot.remote())
    assert after["estimate"] == before["estimate"]
    assert after["received"]["completions"] == before["received"]["completions"] == 100

    # a bad batch is counted, never crashes the actor
    assert ray.get(get_controller().ingest.remote(TelemetryBatch("ghost"))) is None
    assert ray.get(get_controller().snapshot.remote())["rejected"]["unknown_replica"] == 1
    ray.kill(get_controller(), no_restart=True)
