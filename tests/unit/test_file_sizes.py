"""No Python source file of the repository is over 600 lines: a longer one is split by concern.

Every ``*.py`` counts, tests included (a test module is read and reviewed like any
other), except what is not the project's source: hidden folders (``.venv``, ``.git``,
``.tools``...), the built models in ``models/``, build outputs and caches.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAX_LINES = 600
#: Folders (at any depth) that hold no source of the project.
NOT_SOURCE = {"models", "build", "dist", "site", "node_modules", "__pycache__"}
#: Files allowed over the limit (none today; an entry needs a reason, and must go when it no longer applies).
KNOWN_EXCEPTIONS: dict[str, str] = {}


def python_sources(root: Path = REPO) -> dict[str, int]:
    """Every Python source file under ``root`` (a path relative to it, with ``/``) and its number of lines."""
    sizes = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in NOT_SOURCE and not d.endswith(".egg-info")]
        for name in files:
            if name.endswith(".py"):
                path = Path(folder, name)
                sizes[path.relative_to(root).as_posix()] = len(path.read_text(encoding="utf-8").splitlines())
    return sizes


def test_no_python_file_is_over_the_limit() -> None:
    sizes = python_sources()
    too_long = [f"{path}: {n} lines" for path, n in sorted(sizes.items()) if n > MAX_LINES and path not in KNOWN_EXCEPTIONS]
    assert not too_long, f"over {MAX_LINES} lines, split by concern:\n" + "\n".join(too_long)


def test_known_exceptions_are_still_needed() -> None:
    sizes = python_sources()
    done = sorted(path for path in KNOWN_EXCEPTIONS if sizes.get(path, 0) <= MAX_LINES)
    assert not done, f"no longer over {MAX_LINES} lines (or gone): remove from KNOWN_EXCEPTIONS: {done}"


def test_the_walk_sees_the_sources_and_skips_the_rest(tmp_path: Path) -> None:
    for path in ("pkg/a.py", "tests/unit/test_a.py", ".venv/lib/b.py", "models/tiny/c.py", "x.egg-info/d.py", "pkg/e.txt"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("x = 1\n" * 3)
    assert python_sources(tmp_path) == {"pkg/a.py": 3, "tests/unit/test_a.py": 3}
    real = python_sources()
    assert "tests/unit/test_file_sizes.py" in real and "controller/fleet.py" in real
    assert not any(path.startswith(".venv/") for path in real)
