"""One import name, arrows that run down, a pure core: checked on the code as it is installed.

The repository keeps a folder per role (controller/, replicas/, deploy/...) and
pyproject maps each to a subpackage of ``ebplus``. import-linter reads packages
from the filesystem, so the contract is checked on a copy laid out as a wheel
installs it (built from the same mapping); the copy is also where a deliberately
added upward import is shown to fail.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
OLD_NAMES = {"controller", "replicas", "deploy", "bench", "dashboards"}


def installed_layout(dest: Path) -> Path:
    """``dest`` holding ``ebplus/`` as ``pip install .`` lays it out (Python sources only)."""
    mapping = PYPROJECT["tool"]["setuptools"]["package-dir"]
    for package in PYPROJECT["tool"]["setuptools"]["packages"]:
        top = next(name for name in sorted(mapping, key=len, reverse=True) if package.startswith(name))
        source = REPO / mapping[top] / Path(*package[len(top) :].split(".")[1:])
        target = dest / Path(*package.split("."))
        target.mkdir(parents=True, exist_ok=True)
        for py in source.glob("*.py"):
            shutil.copy(py, target / py.name)
    return dest


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint, "import-linter is not installed (the dev extra)"
    return subprocess.run(
        [lint, "--config", str(REPO / "pyproject.toml")],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return installed_layout(tmp_path_factory.mktemp("site"))


def test_every_package_of_the_mapping_exists_and_nothing_is_left_out(layout: Path) -> None:
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    found = {".".join(p.relative_to(layout).parts) for p in layout.rglob("__init__.py") for p in [p.parent]}
    assert found == listed
    mapping = PYPROJECT["tool"]["setuptools"]["package-dir"]
    on_disk = {
        f"{pkg}.{'.'.join(init.parent.relative_to(REPO / folder).parts)}".rstrip(".")
        for pkg, folder in mapping.items()
        for init in (REPO / folder).rglob("__init__.py")
    }
    assert on_disk <= listed, f"packages on disk missing from [tool.setuptools] packages: {sorted(on_disk - listed)}"


def test_the_contract_holds(layout: Path) -> None:
    result = lint_imports(layout)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 2 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("controller/planner.py", "import ebplus.replicas.phases", "Arrows run down"),  # an upward arrow
        ("replicas/phases.py", "import vllm.config", "The pure core"),  # the engine in the core
        ("controller/estimator.py", "from ebplus.controller import actor", "The pure core"),  # Ray, indirectly
    ],
)
def test_the_contract_fails_on_a_deliberate_violation(tmp_path: Path, module: str, line: str, contract: str) -> None:
    root = installed_layout(tmp_path)
    target = root / "ebplus" / module
    target.write_text(target.read_text() + f"\n{line}  # deliberately wrong\n")
    result = lint_imports(root)
    assert result.returncode != 0
    assert contract in result.stdout and "BROKEN" in result.stdout


def test_nothing_imports_the_bare_folder_names() -> None:
    """``import controller`` would load a second copy of a module (metrics registered twice)."""
    bad = []
    for path in REPO.rglob("*.py"):
        parts = path.relative_to(REPO).parts
        if parts[0].startswith(".") or parts[0] in {"models", "build", "site"}:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            bad += [f"{path.relative_to(REPO)}:{node.lineno}: {n}" for n in names if n.split(".")[0] in OLD_NAMES]
    assert not bad, "import the ebplus.* names:\n" + "\n".join(bad)


def test_the_wheel_installs_one_top_level_package(tmp_path: Path) -> None:
    # built from a copy: setuptools writes build/ into the source tree
    src = tmp_path / "src"
    folders = {"ebplus", *PYPROJECT["tool"]["setuptools"]["package-dir"].values()}
    for name in folders:
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"ebplus", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}
    assert "ebplus/controller/profiles/h200.yaml" in names  # shipped profiles are package data
    assert "ebplus/replicas/scheduler.py" in names and "ebplus/deploy/app.py" in names
    # the dashboards ship as what Grafana imports; their generator stays in the checkout (docgen)
    assert {"ebplus/dashboards/ebplus-control-plane.json", "ebplus/dashboards/ebplus-serving.json"} <= set(names)
    assert not [n for n in names if n.startswith("ebplus/dashboards/") and n.endswith(".py") and "__init__" not in n]


#: The fault-injection harness's signals and node removal (tests/harness): never in an installed file.
FAULT_NAMES = {"SIGSTOP", "SIGCONT", "remove_node", "kill_node"}
#: Calls that end an actor or a process.
ENDINGS = ("ray.kill", "os.kill", "os.killpg", "send_signal")
#: The installed modules that make such a call, and why: the product's own lifecycle, never a fault.
ALLOWED_ENDINGS = {
    ("controller/lifecycle.py", "ray.kill"): "the controller's upgrade in place ends the old actor after its snapshot",
    ("deploy/cli.py", "ray.kill"): "`ebplus stop` ends the phase board actor `ebplus serve` started",
    ("deploy/serve_env.py", "os.kill"): "`ebplus serve` ends the processes left in its own session directory",
}


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def fault_calls(root: Path, allowed: dict[tuple[str, str], str]) -> list[tuple[str, int, str]]:
    """``(module, line, what)`` for each fault-injection name and each ending call not in ``allowed``, in the
    ``.py`` files under ``root/ebplus``."""
    found = []
    for path in sorted((root / "ebplus").rglob("*.py")):
        module = path.relative_to(root / "ebplus").as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute | ast.Name) and _dotted(node).rpartition(".")[2] in FAULT_NAMES:
                found.append((module, node.lineno, _dotted(node)))
            elif isinstance(node, ast.Call):
                call = _dotted(node.func)
                ending = next((e for e in ENDINGS if call == e or call.endswith("." + e)), None)
                if ending is not None and (module, ending) not in allowed:
                    found.append((module, node.lineno, ending))
    return found


def test_no_installed_file_injects_faults(layout: Path) -> None:
    """The fault-injection harness (SIGSTOP, node removal, killing replicas) lives beside the product, in
    tests/harness; the only endings installed are the product's own lifecycle's, each still made (the list
    cannot outlive its reasons)."""
    assert fault_calls(layout, ALLOWED_ENDINGS) == []
    assert {(module, what) for module, _, what in fault_calls(layout, {})} == set(ALLOWED_ENDINGS)


def test_a_fault_call_in_an_installed_file_is_found(tmp_path: Path) -> None:
    root = installed_layout(tmp_path)
    target = root / "ebplus" / "replicas" / "server.py"
    target.write_text(target.read_text() + "\n\ndef _hang(pid):\n    os.kill(pid, signal.SIGSTOP)\n")
    line = len(target.read_text().splitlines())
    found = sorted(fault_calls(root, ALLOWED_ENDINGS))
    assert found == [("replicas/server.py", line, "os.kill"), ("replicas/server.py", line, "signal.SIGSTOP")]
