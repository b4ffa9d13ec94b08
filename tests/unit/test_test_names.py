"""No two test modules share a file name: pytest imports each under its bare name (the ``prepend``
import mode, folders without ``__init__.py``), so a second ``test_x.py`` anywhere stops the whole
collection with "import file mismatch" (a clean clone has no ``__pycache__`` to hide it locally)."""

from __future__ import annotations

from collections import defaultdict

from test_file_sizes import python_sources


def test_test_module_names_are_unique() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in python_sources():
        name = path.rsplit("/", 1)[-1]
        if name.startswith("test_") or name == "conftest.py":
            by_name[name].append(path)
    clashes = {name: paths for name, paths in by_name.items() if len(paths) > 1 and name != "conftest.py"}
    assert not clashes, f"test modules with the same name (rename one): {clashes}"
