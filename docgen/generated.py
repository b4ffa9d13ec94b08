"""Files the generators write: compared with what the code renders now (``--check``) or rewritten.

One rule for every generator (``docgen.reference``, ``docgen.helm_values``): ``--check``
exits 1 naming each stale file and the command that rewrites it; otherwise only the
files whose content changed are written, so an unchanged tree stays untouched.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def stale(files: Mapping[Path, str]) -> list[Path]:
    """The files of ``files`` that are missing or differ from the content given for them."""
    return [path for path, text in files.items() if not path.exists() or path.read_text() != text]


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def check_or_write(files: Mapping[Path, str], check: bool, command: str) -> int:
    """``--check``: 1 if any file is stale (each one named, with ``command``); else write the stale ones, 0."""
    outdated = stale(files)
    if check:
        if outdated:
            print(f"stale: {', '.join(_shown(p) for p in outdated)}; run `{command}`", file=sys.stderr)
        return 1 if outdated else 0
    for path in outdated:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[path])
        print(f"wrote {_shown(path)}")
    return 0
