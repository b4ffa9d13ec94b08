"""Autoscaling in the fleet simulator: Ray Serve's default policy and policy-first, on the same traffic.

Every ``tick_s`` of simulated time a policy reads the fleet and names a replica count. As Ray Serve applies a
policy's answer, a count above the running one must hold for ``upscale_delay_s`` before replicas are added
(below it, ``downscale_delay_s`` before they are removed), within ``[min_replicas, max_replicas]``. A new
replica serves ``startup_s`` after it was asked for (an engine's start); a removed one takes no new request
and leaves once it has served what it holds. Both are paid for meanwhile: the run reports replica-seconds
from the first request to the last completion, starting and draining replicas included, and every scale event.

Policies:

* ``default``: Ray Serve's own (``replica_queue_length_autoscaling_policy``): the ongoing requests per
  replica (running and waiting), averaged over ``look_back_s``, over ``target_ongoing_requests``;
* ``policy-first``: :func:`ebplus.controller.scaling.decide` on what the fleet's controller knows (the same
  function the deployment's Serve policy applies, :mod:`ebplus.deploy.autoscaling`).
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from ebplus.controller.scaling import ScalingDecision, capacities, decide

if TYPE_CHECKING:
    from ebplus.simulator.fleet import FleetSimulator


@dataclass(frozen=True)
class ScalingConfig:
    """What an :class:`Autoscaler` does; defaults are Ray Serve's where it has one (delays shortened: the
    simulated traces last minutes, not a day)."""

    policy: Literal["default", "policy-first"]
    min_replicas: int = 1
    max_replicas: int = 8
    target_ongoing_requests: float = 64.0  # default: ongoing requests per replica it scales towards
    look_back_s: float = 30.0  # default: the window its ongoing requests are averaged over
    utilization: float = 0.8  # policy-first: the share of their best capacity replicas may run at
    down: float = 0.7  # policy-first: scale down below this share of what one replica fewer affords
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 120.0
    startup_s: float = 60.0
    tick_s: float = 1.0

    def __post_init__(self) -> None:
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"need 1 <= min_replicas <= max_replicas, got {self.min_replicas}, {self.max_replicas}")
        if self.policy not in ("default", "policy-first"):
            raise ValueError(f"unknown autoscaling policy {self.policy!r}; choose default or policy-first")


@dataclass
class ScaleEvent:
    at: float
    replicas: int  # the count it moved to (replicas asked for, starting ones included)
    why: str


@dataclass
class Autoscaler:
    """Adds and removes a :class:`~ebplus.simulator.fleet.FleetSimulator`'s replicas as ``config.policy`` says."""

    config: ScalingConfig
    next_tick: float = 0.0
    events: list[ScaleEvent] = field(default_factory=list)
    decisions: list[ScalingDecision] = field(default_factory=list)  # policy-first's answers, as /admin/history has them
    _starting: list[float] = field(default_factory=list)  # when each replica asked for serves
    _want: tuple[int, float] | None = None  # a count other than the running one, and since when
    _ongoing: deque[tuple[float, int]] = field(default_factory=deque)  # default: (t, ongoing requests)
    _paid: list[tuple[float, int]] = field(default_factory=list)  # (t, replicas paid for from t on)

    def tick(self, fleet: FleetSimulator) -> None:
        now, cfg = fleet.now, self.config
        self.next_tick = now + cfg.tick_s
        if not self._paid:
            self.changed(fleet)
        while self._starting and self._starting[0] <= now:
            self._starting.pop(0)
            fleet.add_replica()
        count = len(fleet.serving) + len(self._starting)
        desired, why = self._desired(fleet, count)
        desired = min(cfg.max_replicas, max(cfg.min_replicas, desired))
        if desired == count:
            self._want = None
            return
        if self._want is None or (self._want[0] > count) != (desired > count):
            self._want = (desired, now)
            return
        delay = cfg.upscale_delay_s if desired > count else cfg.downscale_delay_s
        if now - self._want[1] < delay:
            self._want = (desired, self._want[1])
            return
        self._want = None
        if desired > count:
            self._starting += [now + cfg.startup_s] * (desired - count)
        else:
            for i in sorted(fleet.serving, reverse=True)[: count - desired]:  # the newest first
                fleet.drain_replica(i)
        self.events.append(ScaleEvent(now, desired, why))
        self.changed(fleet)

    def changed(self, fleet: FleetSimulator) -> None:
        """The replicas paid for from now on: serving, starting, and drained ones still serving what they hold."""
        draining = sum(1 for i, queued in enumerate(fleet._queued) if queued and i not in fleet.serving)
        self._paid.append((fleet.now, len(fleet.serving) + len(self._starting) + draining))

    def _desired(self, fleet: FleetSimulator, count: int) -> tuple[int, str]:
        cfg, now = self.config, fleet.now
        if cfg.policy == "default":
            ongoing = sum(fleet.replicas[i].m + len(fleet.replicas[i].waiting) for i in fleet.serving)
            self._ongoing.append((now, ongoing))
            while self._ongoing[0][0] < now - cfg.look_back_s:
                self._ongoing.popleft()
            mean = sum(o for _, o in self._ongoing) / len(self._ongoing)
            desired = math.ceil(mean / cfg.target_ongoing_requests) if mean else cfg.min_replicas
            return desired, f"{mean:.0f} ongoing requests, {cfg.target_ongoing_requests:g} a replica"
        if fleet.controller is None:
            raise ValueError("policy-first needs an online policy (eb with online k, or eb+): a controller")
        d = decide(capacities(fleet.controller), count, utilization=cfg.utilization, down=cfg.down, at=now)
        self.decisions.append(d)
        return d.target, d.reason

    def report(self, end: float) -> dict:
        """Replica-seconds paid for from the first tick to ``end``, and the scale events."""
        marks = [*self._paid, (end, 0)]
        paid = sum(n * (t1 - t0) for (t0, n), (t1, _) in itertools.pairwise(marks) if t1 > t0)
        return {
            "autoscaling": self.config.policy,
            "replica_seconds": paid,
            "scale_events": len(self.events),
            "events": [{"at_s": round(e.at, 1), "replicas": e.replicas, "why": e.why} for e in self.events],
        }
