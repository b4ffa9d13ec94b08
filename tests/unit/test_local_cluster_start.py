"""The multi-node harness's start retries: a missed Ray startup wait is tried again, anything else is raised.

CI lost a whole scale-out module once to a GCS that did not publish its port within Ray's 30 s on a
2-core machine still stopping the previous module's deployment; these tests pin what the harness
does about it without starting Ray.
"""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest

from harness import nodes
from harness.nodes import GCS_PORT_WAIT_ENV, GCS_PORT_WAIT_S, LocalCluster, NodeSpec

GCS_TIMEOUT = "Timed out waiting for file /tmp/ebmn-x/ray/session_1/gcs_server_port_abc"
RAYLET_TIMEOUT = "The current node timed out during startup."


class _Flaky(LocalCluster):
    """A cluster whose start fails with the given errors first, recording each start and shutdown."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__(NodeSpec("head", num_cpus=1), [])
        self.errors = list(errors)
        self.calls: list[str] = []

    def start(self) -> str:
        self.calls.append("start")
        if self.errors:
            raise Exception(self.errors.pop(0))  # Ray's own type for these
        return "127.0.0.1:6379"

    def shutdown(self) -> None:
        self.calls.append("shutdown")


@pytest.fixture(autouse=True)
def _no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """The harness's pause between tries, skipped (its own clock only: ``time.sleep`` stays everyone else's)."""
    monkeypatch.setattr(nodes, "time", SimpleNamespace(sleep=lambda _s: None, monotonic=time.monotonic))


@pytest.mark.parametrize("message", [GCS_TIMEOUT, RAYLET_TIMEOUT])
def test_a_missed_startup_wait_is_tried_again_after_a_shutdown(message: str) -> None:
    cluster = _Flaky([message])
    with cluster:
        assert cluster.calls == ["start", "shutdown", "start"]
    assert cluster.calls[-1] == "shutdown"


def test_the_last_try_raises_the_startup_error() -> None:
    cluster = _Flaky([GCS_TIMEOUT] * nodes.START_ATTEMPTS)
    with pytest.raises(Exception, match="gcs_server_port"), cluster:
        pass
    assert cluster.calls.count("start") == nodes.START_ATTEMPTS


def test_any_other_error_is_raised_at_once() -> None:
    cluster = _Flaky(["node 'w1' is already running"])
    with pytest.raises(Exception, match="already running"), cluster:
        pass
    assert cluster.calls == ["start", "shutdown"]


def test_nodes_start_with_a_longer_gcs_port_wait_and_the_callers_environment_back_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(GCS_PORT_WAIT_ENV, raising=False)  # the suite's conftest sets it for every Ray
    cluster = _Flaky([])
    with cluster._node_env():
        assert os.environ[GCS_PORT_WAIT_ENV] == str(GCS_PORT_WAIT_S)
        assert int(os.environ[GCS_PORT_WAIT_ENV]) > 30  # Ray's default for the in-memory GCS
    assert GCS_PORT_WAIT_ENV not in os.environ
