"""Every dotted path the project writes down for a reader or a config resolves in the code.

Docstrings, comments, doc pages, the chart's values and templates, and the deployment
configs name modules, classes and functions (``ebplus.replicas.scheduler.EBPlusScheduler``,
``ebplus.deploy.app:build_app``); a rename that misses one leaves a reader, or a user's
config, pointing at nothing. This test collects every such path and resolves it: the
longest prefix that is a module (found without importing it), then each remaining part as
an attribute of it (imported). A bare path written without the ``ebplus.`` prefix
(``replicas.scheduler.EBPlusScheduler``, ``deploy.app:build_app``) is refused too: it
names a folder of the repository, not an importable module.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: Where paths are written: code (docstrings and comments), docs, chart, configs.
SOURCES = (
    "README.md",
    "CHANGELOG.md",
    "pyproject.toml",
    "*.py",
    "*/*.py",
    "*/*/*.py",
    "docs/**/*.md",
    "helm/**/*.yaml",
    "helm/**/*.tpl",
    "helm/**/*.txt",
    "helm/**/*.md",
    "deploy/*.yaml",
    "tests/e2e/*.yaml",
    "tests/**/*.yaml",
)
#: Repository folders that install as ``ebplus.<folder>`` (see [tool.setuptools] in pyproject.toml).
ROLE_FOLDERS = ("controller", "replicas", "deploy", "dashboards", "simulator", "profiler")

#: ``ebplus.`` then a subpackage or module of it, or a name one had (a template name such as
#: ``ebplus.fullname`` in the chart, or a host such as ``ebplus.io``, is not a module path).
_FIRST = ("controller", "replicas", "deploy", "dashboards", "simulator", "profiler", "cli", "errors", "bench",
          "reference", "chart_readme")  # fmt: skip
_DOTTED = re.compile(
    r"(?<![\w./-])ebplus\.(?:" + "|".join(_FIRST) + r")\b(?:\.[A-Za-z_]\w*)*(?::[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)?"
)
#: Files that quote old paths on purpose (this test, the docs test's list of moved names, the changelog, the
#: controller benchmark's worker, which also runs on a baseline checkout of the old layout), and the llm_configs
#: tests, whose error messages name keys of a file's ``ebplus:`` section (``ebplus.replicas.num_replicas``).
_QUOTING = (
    "tests/unit/test_module_paths.py",
    "tests/unit/test_docs.py",
    "CHANGELOG.md",
    "benchmarks/controller_fleet.py",
    "tests/unit/test_llm_configs.py",
)
_BARE = re.compile(
    r"(?<![\w./-])(?:" + "|".join(ROLE_FOLDERS) + r")\.[a-z_]\w*(?::[A-Za-z_]\w*|\.[A-Z]\w*)"
)


def source_files() -> list[Path]:
    files: set[Path] = set()
    for pattern in SOURCES:
        files.update(p for p in REPO.glob(pattern) if p.is_file())
    skip = (REPO / ".venv", REPO / ".tools", REPO / "docs" / "benchmarks" / "results", REPO / "build")
    return sorted(p for p in files if not any(p.is_relative_to(s) for s in skip))


def named_paths() -> dict[str, set[str]]:
    """dotted path -> the files that name it."""
    out: dict[str, set[str]] = {}
    for path in source_files():
        if str(path.relative_to(REPO)) in _QUOTING:
            continue
        text = path.read_text(errors="replace")
        for match in _DOTTED.finditer(text):
            name = match.group(0).rstrip(".")
            out.setdefault(name, set()).add(str(path.relative_to(REPO)))
    return out


@cache
def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ModuleNotFoundError, ValueError):
        return False


def resolves(path: str) -> bool:
    """``path`` names a module, or an attribute chain of one (``mod.Class.method``, ``mod:attr``)."""
    module_part, _, attr_part = path.partition(":")
    parts = module_part.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        if _module_exists(module):
            rest = parts[cut:] + (attr_part.split(".") if attr_part else [])
            break
    else:
        return False
    if not rest:
        return True
    try:
        obj = importlib.import_module(module)
    except ImportError:
        return False
    for name in rest:
        if not hasattr(obj, name):
            # a field of a pydantic model or a dataclass, declared but not a class attribute
            fields = getattr(obj, "model_fields", None) or getattr(obj, "__dataclass_fields__", None) or {}
            annotations = getattr(obj, "__annotations__", {})
            return name in fields or name in annotations
        obj = getattr(obj, name)
    return True


def test_the_collector_finds_the_public_paths() -> None:
    """The paths users configure are found (so an empty collection cannot pass the next test)."""
    named = named_paths()
    for public in ("ebplus.replicas.scheduler.EBPlusScheduler", "ebplus.deploy.app:build_app"):
        assert public in named, f"{public} is not named anywhere the test looks"


def test_resolves_refuses_what_does_not_exist() -> None:
    assert resolves("ebplus.replicas.scheduler.EBPlusScheduler")
    assert resolves("ebplus.deploy.app:build_app")
    assert not resolves("ebplus.bench.sim")
    assert not resolves("ebplus.replicas.scheduler.NoSuchScheduler")
    assert not resolves("ebplus.deploy.app:no_such_builder")


def test_every_named_module_path_resolves() -> None:
    broken = sorted(f"{name}  ({', '.join(sorted(files))})" for name, files in named_paths().items() if not resolves(name))
    assert not broken, "dotted paths that do not resolve:\n" + "\n".join(broken)


@pytest.mark.parametrize("pattern", [_BARE])
def test_no_bare_module_path(pattern: re.Pattern[str]) -> None:
    found = sorted(
        f"{path.relative_to(REPO)}: {m.group(0)}"
        for path in source_files()
        if str(path.relative_to(REPO)) not in _QUOTING
        for m in pattern.finditer(path.read_text(errors="replace"))
        if (REPO / m.group(0).split(".")[0] / (m.group(0).split(".")[1].split(":")[0] + ".py")).is_file()
    )
    assert not found, "module paths without the ebplus. prefix (write ebplus.<folder>...):\n" + "\n".join(found)
