"""deploy/progress.py: the start-up watch of `ebplus serve`, driven with Ray Serve's own status types.

A scripted sequence of ``ServeStatus`` objects stands in for ``serve.status()`` over
time, a fake clock for the minutes, and log files written to a temporary session
directory for Ray's logs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from ray.serve.schema import (
    ApplicationStatus,
    ApplicationStatusOverview,
    DeploymentStatus,
    DeploymentStatusOverview,
    DeploymentStatusTrigger,
    ReplicaState,
    ServeStatus,
)

from ebplus.deploy.progress import DeployError, last_error_line, snapshot, wait_until_running

APP = "ebplus"


def status(app: ApplicationStatus, message: str = "", **replicas: dict[ReplicaState, int]) -> ServeStatus:
    deployments = {
        name: DeploymentStatusOverview(
            status=DeploymentStatus.HEALTHY if set(states) == {ReplicaState.RUNNING} else DeploymentStatus.UPDATING,
            status_trigger=DeploymentStatusTrigger.CONFIG_UPDATE_STARTED,
            replica_states=states,
            message="",
        )
        for name, states in replicas.items()
    }
    overview = ApplicationStatusOverview(status=app, message=message, last_deployed_time_s=0.0, deployments=deployments)
    return ServeStatus(applications={APP: overview})


STARTING = status(
    ApplicationStatus.DEPLOYING,
    EBPlusIngress={ReplicaState.RUNNING: 1},
    LLMServer={ReplicaState.STARTING: 1},
)
RUNNING = status(
    ApplicationStatus.RUNNING, EBPlusIngress={ReplicaState.RUNNING: 1}, LLMServer={ReplicaState.RUNNING: 1}
)


class Clock:
    """A fake monotonic clock that ``sleep`` advances."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def watch(sequence, timeout_s: float, session: Path, clock: Clock, said: list[str]) -> float:
    states = iter(sequence)
    last = [None]

    def current():
        last[0] = next(states, last[0])
        return last[0]

    return wait_until_running(
        current, APP, timeout_s, session, said.append, every_s=10, poll_s=1,
        clock=clock, sleep=clock.sleep, wall_clock=lambda: 1_000_000.0,
    )  # fmt: skip


def test_snapshot_words() -> None:
    snap = snapshot(STARTING, APP)
    assert snap.status == "DEPLOYING"
    assert snap.line() == "DEPLOYING: EBPlusIngress HEALTHY (1 RUNNING); LLMServer UPDATING (1 STARTING)"
    assert snapshot(ServeStatus(), APP).line() == "NOT_STARTED: no deployments yet"


def test_progress_every_10_s_and_on_change_then_running(tmp_path: Path) -> None:
    clock, said = Clock(), []
    took = watch([STARTING] * 25 + [RUNNING], 600, tmp_path, clock, said)
    assert took == 25
    assert said == [
        f"{t:5.0f} s  DEPLOYING: EBPlusIngress HEALTHY (1 RUNNING); LLMServer UPDATING (1 STARTING)"
        for t in (0, 10, 20)
    ]


def test_timeout_names_logs_and_last_error(tmp_path: Path) -> None:
    serve_logs = tmp_path / "logs" / "serve"
    serve_logs.mkdir(parents=True)
    (serve_logs / "controller_1.log").write_text(
        "INFO 2026-01-01 12:00:00,000 controller 1 -- Deploying new version of Deployment(name='LLMServer')\n"
    )
    replica = serve_logs / "replica_ebplus_LLMServer_abc.log"
    replica.write_text(
        "INFO 2026-01-01 12:00:01,000 LLMServer abc -- Starting engine\n"
        "ERROR 2026-01-01 12:00:05,000 LLMServer abc -- Exception in replica constructor\n"
        "Traceback (most recent call last):\n"
        '  File "vllm/engine/arg_utils.py", line 1, in create_engine_config\n'
        "ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0\n"
        "INFO 2026-01-01 12:00:06,000 LLMServer abc -- retrying\n"
    )
    older = tmp_path / "logs" / "worker-1.err"
    older.write_text("RuntimeError: an old failure of another session\n")
    os.utime(older, (1, 1))  # written long before this deploy started: ignored
    clock, said = Clock(), []
    with pytest.raises(DeployError) as info:
        watch([STARTING], 30, tmp_path, clock, said)
    err = info.value
    assert str(err) == err.summary
    assert err.summary.startswith("the application is not running after 30 s (DEPLOYING); raise --deploy-timeout")
    assert err.details == [
        f"logs: {serve_logs} (replicas, controller) and {tmp_path / 'logs'}",
        f"last error ({replica.name}): ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0",
    ]
    assert len(said) == 4  # 0, 10, 20, 30 s


def test_deploy_failed_stops_at_once_with_serves_message(tmp_path: Path) -> None:
    failed = status(
        ApplicationStatus.DEPLOY_FAILED,
        "Deploying app 'ebplus' failed with exception:\nTraceback ...\nFileNotFoundError: /models/Qwen3-8B",
        LLMServer={},
    )
    clock, said = Clock(), []
    with pytest.raises(DeployError) as info:
        watch([STARTING, STARTING, failed], 600, tmp_path, clock, said)
    assert info.value.summary == "the application failed to deploy after 2 s"
    assert "Serve says: FileNotFoundError: /models/Qwen3-8B" in info.value.details


def test_no_limit_and_cancel(tmp_path: Path) -> None:
    clock, cancelled = Clock(), [False]

    def stop_after_an_hour(seconds: float) -> None:
        clock.sleep(seconds)
        cancelled[0] = clock.now >= 3600

    took = wait_until_running(
        lambda: STARTING, APP, 0, tmp_path, lambda _: None, clock=clock, sleep=stop_after_an_hour,
        wall_clock=lambda: 0.0, cancelled=lambda: cancelled[0],
    )  # fmt: skip
    assert took == 3600


def test_last_error_line_only_from_this_deploy(tmp_path: Path) -> None:
    assert last_error_line(tmp_path) is None
    old = tmp_path / "logs" / "worker-7.err"
    old.parent.mkdir()
    old.write_text("some output\nray.exceptions.RayActorError: The actor died unexpectedly\n")
    assert last_error_line(tmp_path) == (old, "ray.exceptions.RayActorError: The actor died unexpectedly")
    os.utime(old, (1, 1))
    assert last_error_line(tmp_path, since=1_000_000.0) is None


def test_root_cause_wins_over_wrappers_and_summaries(tmp_path: Path) -> None:
    """As Serve's controller logs a replica whose engine config failed (seen with a model directory
    that holds no model): the exception and its continued message, not the wrappers around it."""
    log = tmp_path / "logs" / "serve" / "controller_1.log"
    log.parent.mkdir(parents=True)
    log.write_text(
        "ERROR 2026-11-30 12:48:34,226 controller 1 -- Exception in Replica(id='dx6gze16'), the replica will be stopped.\n"
        "Traceback (most recent call last):\n"
        "ray.exceptions.RayTaskError(RuntimeError): ray::ServeReplica:ebplus:LLMServer.initialize_and_get_metadata()\n"
        "RuntimeError: Traceback (most recent call last):\n"
        '  File "vllm_engine.py", line 222, in _get_vllm_engine_config\n'
        '    raise RuntimeError(f"Failed to create vLLM engine config: {e}") from None\n'
        "RuntimeError: Failed to create vLLM engine config: 1 validation error for ModelConfig\n"
        "  Value error, Invalid repository ID or local directory specified: '/tmp/notamodel'.\n"
        "Please verify the following requirements:\n"
        "INFO 2026-11-30 12:48:34,227 controller 1 -- Stopping Replica(id='dx6gze16')\n"
        "ERROR 2026-11-30 12:48:51,028 controller 1 -- Failed to update the deployments ['LLMServer'].\n"
    )
    assert last_error_line(tmp_path) == (
        log,
        "RuntimeError: Failed to create vLLM engine config: 1 validation error for ModelConfig "
        "Value error, Invalid repository ID or local directory specified: '/tmp/notamodel'.",
    )
