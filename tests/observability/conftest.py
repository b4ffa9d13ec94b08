"""Fixtures of the observability tests; ``dashboards/`` (not an installed package) is imported from the repo."""

from __future__ import annotations

import sys

from external_tools import REPO

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from observability.prom import prometheus  # noqa: F401  (fixture)
