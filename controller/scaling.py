"""Policy before replicas: how many replicas a model needs, from what the controller knows of each one.

A fleet under latency targets has two levers: what one controller update changes on today's replicas (the
mode, ``k`` and ``N`` each runs) and how many replicas there are. A replica takes minutes to start and is
paid for by the second, so this policy pulls that lever last:

* Each replica's last plan prices both modes with the batch at its cap
  (:attr:`~ebplus.controller.evidence.ModeCheck.capacity`, tokens/s, corrected by what the replica measured)
  and says whether each meets the latency targets (:attr:`~ebplus.controller.evidence.ModeCheck.meets`).
  Its *best* capacity is the larger of the modes that meet them (both, without targets, or when neither does:
  an overloaded replica's queue is in their predicted latency); its *current* one is that of the mode it runs.
* Its demand is the tokens/s it computed (:attr:`~ebplus.controller.evidence.Judgement.load`, the offered
  load under open-loop traffic), scaled up by its queue beyond the batch (``running + waiting`` over ``N``, at
  most :data:`MAX_QUEUE_RATIO`): a saturated replica computes no more than its capacity, and its queue is what
  shows the rest.
* With ``u`` the utilisation the replicas may run at (queues and tail latency grow without bound near 1):
  the demand above ``u`` x the fleet's *best* capacity: **up**, to as many replicas as the demand needs at
  ``u`` of the mean best capacity (**hold** while the replicas already asked for, starting ones included, are
  that many); above ``u`` x the *current* capacity only: **policy**, the replicas stay
  and the controller moves them to their best mode now; below ``down`` x ``u`` x the best capacity that one
  replica fewer would have: **down**, to as many as that leaves the demand within ``down`` of; else **hold**.
* A replica without a plan yet (it has not pushed a full window of completions) adds neither capacity nor
  demand; a fleet with no plan at all holds.

No vLLM or Ray import: the controller actor answers with a :class:`ScalingDecision`, which Ray Serve's
autoscaling policy (:mod:`ebplus.deploy.autoscaling`) and the fleet simulator both apply.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Literal

from ebplus.controller.evidence import Judgement
from ebplus.controller.messages import Mode

if TYPE_CHECKING:
    from ebplus.controller.fleet import FleetController

Action = Literal["up", "down", "hold", "policy"]
#: A saturated replica's queue says its demand is over its capacity, not by how much (a backlog is not a rate):
#: it scales the demand up to this factor, so each step (and Serve's delay before it) adds at most that much.
MAX_QUEUE_RATIO = 2.0


@dataclass(frozen=True)
class ReplicaCapacity:
    """One replica as the policy sees it (tokens/s)."""

    replica_id: str
    active: Mode  # the mode it runs
    current: float  # what that mode computes with the batch at its cap
    best: float  # the most a mode meeting the targets computes (either mode's, if neither does)
    best_mode: Mode
    demand: float  # tokens/s offered to it

    @classmethod
    def of(cls, replica_id: str, active: Mode, judgement: Judgement, load: float, queue_ratio: float) -> ReplicaCapacity:
        """From a replica's last :class:`Judgement`, its load (tokens/s) and ``(running + waiting) / N``.

        Neither mode meeting the targets (an overloaded replica: its queue is in their predicted latency) leaves
        the faster one as its best: more replicas, not another mode, is then what helps."""
        checks = [judgement.eb, judgement.mb]
        meeting = [c for c in checks if c.meets is not False] or checks
        best = max(meeting, key=lambda c: c.capacity)
        return cls(
            replica_id=replica_id,
            active=active,
            current=judgement.of(active).capacity,
            best=best.capacity,
            best_mode=best.mode,
            demand=load * min(MAX_QUEUE_RATIO, max(1.0, queue_ratio)),
        )


@dataclass(frozen=True)
class ScalingDecision:
    """One answer of the policy, with what it was made of (``/admin/history`` shows these)."""

    at: float
    model: str
    replicas: int  # running when it was asked
    target: int
    action: Action
    demand: float  # tokens/s, the fleet's
    current: float  # tokens/s the replicas compute in the modes they run
    best: float  # tokens/s they would in their best modes
    planned: int  # replicas whose plan counted
    reason: str

    def as_dict(self) -> dict:
        return asdict(self)


def decide(
    capacities: Iterable[ReplicaCapacity],
    replicas: int,
    *,
    utilization: float,
    down: float,
    model: str = "",
    at: float = 0.0,
) -> ScalingDecision:
    """The replicas ``model`` needs, ``replicas`` running (see the module docstring).

    Args:
        capacities: the replicas that have a plan.
        replicas: replicas running now (Serve's count: it may include some without a plan yet).
        utilization: the share ``u`` of their best capacity the replicas may run at, in (0, 1].
        down: scale down only while the demand stays below this share of what one replica fewer affords at ``u``.
    """
    if not 0 < utilization <= 1 or not 0 < down < 1:
        raise ValueError(f"utilization must be in (0, 1] and down in (0, 1), got {utilization} and {down}")
    caps = list(capacities)
    demand = sum(c.demand for c in caps)
    current = sum(c.current for c in caps)
    best = sum(c.best for c in caps)

    def decision(target: int, action: Action, reason: str) -> ScalingDecision:
        return ScalingDecision(at, model, replicas, target, action, demand, current, best, len(caps), reason)

    if not caps:
        return decision(replicas, "hold", "no replica has a plan yet")
    mean_best = best / len(caps)
    if demand > utilization * best:
        starting = replicas > len(caps)  # asked for, not planned yet: their capacity is not in ``best``
        if mean_best <= 0:  # no capacity priced (a plan before any step was timed)
            if starting:
                return decision(replicas, "hold", "no capacity known yet; replicas asked for are starting")
            return decision(replicas + 1, "up", "demand, and no capacity known yet: one more")
        need = math.ceil(demand / (utilization * mean_best))
        if need <= replicas:
            return decision(
                replicas, "hold", f"demand {demand:,.0f} tok/s needs {need} replicas: the {replicas} asked for are starting"
            )
        return decision(
            need,
            "up",
            f"demand {demand:,.0f} tok/s is over {utilization:.0%} of what the replicas afford in their best modes "
            f"({best:,.0f}): {need} replicas of {mean_best:,.0f} each",
        )
    if demand > utilization * current:
        modes = sorted({c.best_mode.value for c in caps if c.best_mode is not c.active})
        return decision(
            replicas,
            "policy",
            f"demand {demand:,.0f} tok/s is over {utilization:.0%} of what the replicas compute in the modes they run "
            f"({current:,.0f}) but not of their best ({best:,.0f}): no new replica, the controller moves them "
            f"to {'/'.join(modes) or 'their best k and N'}",
        )
    fewer = replicas - 1
    if fewer >= 1 and demand < down * utilization * mean_best * fewer:
        target = max(1, math.ceil(demand / (down * utilization * mean_best)))
        return decision(
            target,
            "down",
            f"demand {demand:,.0f} tok/s stays under {down:.0%} of {utilization:.0%} of what {target} replica(s) "
            f"afford in their best modes ({target * mean_best:,.0f})",
        )
    return decision(replicas, "hold", f"demand {demand:,.0f} tok/s within {utilization:.0%} of {current:,.0f}")


def capacities(fleet: FleetController, model: str = "") -> list[ReplicaCapacity]:
    """What ``fleet`` knows of the capacity and demand of each replica serving ``model`` ("": all) that was
    judged once (its newest plan with a judgement: a plan at low concurrency judges nothing, and capacity is
    priced with the batch at its cap, so it does not age with the load)."""
    out = []
    for rid, replica in fleet.replicas.items():
        judged = replica.planner.judged
        if (model and replica.model != model) or judged is None:
            continue
        queue = (replica.concurrency or 0.0) / max(1, replica.current.n)
        out.append(ReplicaCapacity.of(rid, replica.current.active, judged, replica.load or 0.0, queue))
    return out
