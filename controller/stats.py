"""Plain-data statistics the controller keeps for the exporter (no prometheus import).

The exporter (``controller/exporter.py``) turns snapshots of these into
Prometheus metric families; keeping them plain makes them persistable and
testable without a metrics backend.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

# Step times span ~0.5 ms (a small prefill on a fast GPU) to seconds (CPU engines).
STEP_SECONDS_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
# A controller update is ~0.1-10 ms.
UPDATE_SECONDS_BUCKETS: tuple[float, ...] = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1)


@dataclass
class Histogram:
    """Cumulative histogram with fixed upper bounds (Prometheus semantics, +Inf implied)."""

    bounds: Sequence[float]
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative; last = +Inf
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1
