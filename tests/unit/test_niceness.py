"""The engine's CPU priority (``replicas.engine_niceness``): what the setting means and that it reaches every thread."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from pydantic import ValidationError

from ebplus.replicas import niceness
from ebplus.replicas.config import ReplicaSection

# A child like vLLM's engine: a thread before the replica's start, another one after it.
CHILD = textwrap.dedent(
    """
    import os, sys, threading
    stop = threading.Event()
    threading.Thread(target=stop.wait, daemon=True).start()
    print("ready", flush=True)
    sys.stdin.readline()
    seen = []
    def later():
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
    t = threading.Thread(target=later); t.start(); t.join()
    print(seen[0], flush=True)
    """
)


def test_auto_puts_cpu_engines_last_and_leaves_gpu_engines_alone() -> None:
    assert niceness.resolve("auto", "cpu") == niceness.CPU_ENGINE_NICENESS == 19
    assert niceness.resolve("auto", "gpu") is None
    assert niceness.resolve("inherit", "cpu") is None
    assert niceness.resolve(7, "gpu") == 7
    assert ReplicaSection().engine_niceness == "auto"


@pytest.mark.parametrize("value", [20, -1, "low"])
def test_a_niceness_outside_0_to_19_fails_naming_the_field(value: object) -> None:
    with pytest.raises(ValidationError, match="engine_niceness"):
        ReplicaSection(engine_niceness=value)


def _nice(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


def test_every_thread_of_the_children_is_set_and_threads_started_later_inherit_it() -> None:
    if _nice(0) > 16:
        pytest.skip("this process runs at a niceness its children cannot be raised 3 above")
    target = _nice(0) + 3
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "ready"
        tids = [int(t) for t in os.listdir(f"/proc/{child.pid}/task")]
        assert len(tids) >= 2 and all(_nice(t) != target for t in tids)

        done = niceness.renice_children(target)

        assert done.refused == 0 and done.processes >= 1 and done.threads >= len(tids)
        assert [_nice(t) for t in tids] == [target] * len(tids)
        child.stdin.write("go\n")
        child.stdin.flush()
        assert int(child.stdout.readline()) == target  # a thread the engine starts afterwards
    finally:
        child.kill()
        child.wait()
    assert _nice(0) == target - 3  # this process is not its own child: left alone


def test_a_refused_thread_is_counted_and_logged_not_raised(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        child.stdout.readline()

        def refuse(which: int, who: int, value: int) -> None:
            raise PermissionError(1, "Operation not permitted")

        monkeypatch.setattr(niceness.os, "setpriority", refuse)
        with caplog.at_level(logging.WARNING, logger="ray.serve.ebplus"):
            done = niceness.apply(5, "cpu")
    finally:
        child.kill()
        child.wait()
    assert done is not None and done.threads == 0 and done.refused >= 2
    assert "replicas.engine_niceness" in caplog.text and "CAP_SYS_NICE" in caplog.text


def test_inherit_and_gpu_auto_touch_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object) -> None:
        raise AssertionError("no niceness may be set")

    monkeypatch.setattr(niceness, "renice_children", fail)
    assert niceness.apply("inherit", "cpu") is None
    assert niceness.apply("auto", "gpu") is None
    for setting, accelerator in (("inherit", "cpu"), ("auto", "gpu")):
        with niceness.while_starting(setting, accelerator, every_s=0.01):
            time.sleep(0.05)
            assert not any(t.name == "ebplus-engine-niceness" for t in threading.enumerate())  # no sweeper at all


def test_an_engine_is_set_while_it_starts_not_only_once_it_has() -> None:
    """The replica's start blocks for as long as the engine takes to start; a sweep sets it meanwhile."""
    if _nice(0) > 16:
        pytest.skip("this process runs at a niceness its children cannot be raised 3 above")
    target = _nice(0) + 3
    with niceness.while_starting(target, "cpu", every_s=0.02):
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready"
            tids = [int(t) for t in os.listdir(f"/proc/{child.pid}/task")]
            deadline = time.monotonic() + 5
            while any(_nice(t) != target for t in tids) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert [_nice(t) for t in tids] == [target] * len(tids)  # inside the block: the start has not ended
        finally:
            child.kill()
            child.wait()
    assert not any(t.name == "ebplus-engine-niceness" for t in threading.enumerate())  # the sweeper stops with it
    assert _nice(0) == target - 3
