"""The controller as a real Ray actor: named lookup, telemetry round trip, restart with resumed state."""

from __future__ import annotations

import time

import pytest
from factories import registration

from ebplus.controller.actor import ACTOR_NAME, NAMESPACE, get_controller, start_controller
from ebplus.controller.config import ControllerConfig
from ebplus.controller.messages import (
    CompletionRecord,
    FinishReason,
    StepRecord,
    TelemetryBatch,
    ThresholdUpdate,
    decode,
    encode,
)
from ebplus.controller.views import FleetSnapshot, Ping
from harness import wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=1, include_dashboard=False, namespace=NAMESPACE, log_to_driver=False)
    yield ray
    ray.shutdown()


def batch(i: int) -> bytes:
    comps = [CompletionRecord(100, 5 + (i + j) % 40, FinishReason.STOP) for j in range(20)]
    return encode(TelemetryBatch(replica_id="r0", completions=comps, steps=[StepRecord(0, 10, 10, 30, 0.02)], applied_version=i))


def snapshot(handle) -> FleetSnapshot:
    import ray

    return FleetSnapshot.model_validate_json(ray.get(handle.snapshot.remote()))


def wait_for_restart(ray, old_pid: int, timeout_s: float = 60.0) -> Ping:
    """Ping until a *new* actor process answers.

    ``ray.kill`` returns before the kill lands: a ping sent right after it can
    still be served by the dying process, which was never restored.
    """

    def restarted() -> dict | None:
        ping = Ping.model_validate_json(ray.get(get_controller().ping.remote(), timeout=5))
        return ping if ping.pid != old_pid else None

    return wait_until(f"a new controller process (the old pid was {old_pid})", restarted, timeout_s)


@pytest.mark.timeout(180)
def test_named_actor_restarts_and_resumes(ray_local) -> None:
    ray = ray_local
    config = ControllerConfig(update_every=10, min_samples=10, first_update=10, persist_every_s=0.2)
    handle = start_controller(config)
    assert start_controller(ControllerConfig()) is not None  # get_if_exists: the same actor, not a second one
    assert ray.get_actor(ACTOR_NAME, namespace=NAMESPACE)._actor_id == handle._actor_id

    first = decode(ray.get(handle.register.remote(encode(registration("r0")))), ThresholdUpdate)
    assert first.version == 0
    for i in range(5):
        reply = decode(ray.get(handle.ingest.remote(batch(i))), ThresholdUpdate)
    assert reply.version == 5  # an update per batch once 10 completions arrived
    before = snapshot(handle)

    old_pid = Ping.model_validate_json(ray.get(handle.ping.remote())).pid
    time.sleep(0.5)  # let the housekeeping loop persist
    ray.kill(handle, no_restart=False)
    ping = wait_for_restart(ray, old_pid)
    assert ping.restored, ping
    assert ping.version == before.version

    again = decode(ray.get(get_controller().register.remote(encode(registration("r0")))), ThresholdUpdate)
    r0 = before.replicas["r0"]
    assert (again.k, again.n, again.active, again.version) == (r0.k, r0.n, r0.active, r0.version)
    after = snapshot(get_controller())
    assert after.estimate == before.estimate
    assert after.received["completions"] == before.received["completions"] == 100

    # a bad batch is counted, never crashes the actor
    assert ray.get(get_controller().ingest.remote(encode(TelemetryBatch(replica_id="ghost")))) is None
    counted = wait_until(  # reads within SNAPSHOT_TTL_S of the last one share its snapshot
        "the ghost batch counted", lambda: snapshot(get_controller()).rejected.get("unknown_replica"), 5
    )
    assert counted == 1
    ray.kill(get_controller(), no_restart=True)
