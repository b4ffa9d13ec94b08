"""Staggered prefill windows: whether the controller offsets its EB replicas' windows, and by how much.

Under EB a request that reaches a decoding replica waits for that replica's next prefill window.
Left alone, ``R`` replicas open windows at times nothing keeps apart. Staggering gives every EB replica a common period ``P`` (one
replica's window cycle: the time ``k`` of its ``m`` running requests take to finish, ``k * mu_o /
m`` decode steps) and its own phase ``i / R``; the phase machine (``replicas/phases.py``) then also
opens a window at its slots whenever a request is admissible, so the fleet opens one about every
``P / R`` seconds. The cost: a timed window may admit fewer than ``k`` requests, paying a prefill
phase's fixed cost for fewer seats, which the throughput of an EB replica at high load feels.

The rule (:func:`decide`) is pure (no vLLM or Ray import) so tests and the simulator call it as the
controller does. ``off``, and fleets with fewer than two EB replicas (a single replica, all-MB fleets,
EB+ fleets while their replicas run MB), get no stagger: with one replica there is nothing to offset,
and an MB replica has no windows. Otherwise (``on``, the default) every EB replica is staggered once
the controller has a workload estimate to price the cycle with. The fleet benchmark
(``benchmarks/stagger_bench.py``, ``docs/benchmarks/fleet.md``) found no cell where that raised TTFT
p50 or p99, and one of 64 where it cost throughput (3 %).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ebplus.controller.messages import Mode, ThresholdUpdate

if TYPE_CHECKING:
    from ebplus.controller.cost_model import CostModel
    from ebplus.controller.estimator import Estimate

Setting = Literal["on", "off"]


@dataclass(frozen=True, slots=True)
class EbReplica:
    """What the rule needs of one replica running EB: its id (phases are given in id order), ``k``,
    the requests it runs (``m``: observed concurrency, at most ``N``), the mean output (tokens) and its
    decode step's seconds at ``m``."""

    replica_id: str
    k: int
    running: float
    mu_o: float
    decode_step_s: float

    @property
    def cycle_s(self) -> float:
        """Seconds until ``k`` of its ``running`` requests have finished: the window cycle EB alone gives."""
        if self.running <= 0 or self.mu_o <= 0 or self.decode_step_s <= 0:
            return math.nan
        return self.k * self.mu_o / self.running * self.decode_step_s


@dataclass(frozen=True, slots=True)
class StaggerDecision:
    """The controller's stagger: on or off, why, the period, and each replica's phase in ``[0, 1)``."""

    on: bool
    reason: str
    period_s: float = 0.0
    phases: dict[str, float] | None = None

    def phase_of(self, replica_id: str) -> float | None:
        """The replica's phase, or ``None`` when it is not staggered."""
        return None if not self.on or self.phases is None else self.phases.get(replica_id)


OFF = StaggerDecision(False, "no plan yet")


def decide(setting: Setting, eb: Sequence[EbReplica], replicas: int) -> StaggerDecision:
    """The stagger for a fleet of ``replicas`` of which ``eb`` run EB now."""
    if setting == "off":
        return StaggerDecision(False, "off (configured)")
    if len(eb) < 2:
        return StaggerDecision(False, f"{len(eb)} of {replicas} replicas in EB: nothing to offset")
    cycles = [r.cycle_s for r in eb if math.isfinite(r.cycle_s)]
    if not cycles:
        return StaggerDecision(False, "no window cycle estimated yet")
    period = float(sorted(cycles)[len(cycles) // 2])  # the median replica's cycle (upper median)
    ordered = sorted(r.replica_id for r in eb)
    phases = {rid: i / len(ordered) for i, rid in enumerate(ordered)}
    return StaggerDecision(True, f"{len(eb)} of {replicas} replicas in EB, period {period:.3f} s", period, phases)


def of_fleet(
    setting: Setting,
    fleet: Sequence[tuple[str, ThresholdUpdate, float | None, CostModel]],
    estimate: Estimate | None,
) -> StaggerDecision:
    """:func:`decide` for a controller's replicas: ``(id, thresholds without stagger, observed concurrency,
    cost model)`` each. A replica's decode step is priced at ``m = min(concurrency, N)`` requests holding
    the mean prompt and half the mean output (half-way through, on average)."""
    if estimate is None:
        return StaggerDecision(False, "no workload estimate yet")
    eb = []
    for replica_id, update, concurrency, cost in fleet:
        if update.active is not Mode.EB:
            continue
        m = max(1, round(min(concurrency or update.n, update.n)))
        step = cost.step_seconds(0, m, round(m * (estimate.mu_l + estimate.mu_o / 2)))
        eb.append(EbReplica(replica_id, update.effective_k, m, estimate.mu_o, step))
    return decide(setting, eb, len(fleet))
