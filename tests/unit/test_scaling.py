"""Policy before replicas (controller/scaling.py): when the answer is a replica, when it is the policy."""

from __future__ import annotations

import pytest

from ebplus.controller.evidence import Judgement, ModeCheck
from ebplus.controller.messages import Mode
from ebplus.controller.scaling import ReplicaCapacity, decide


def check(mode: Mode, capacity: float, meets: bool | None) -> ModeCheck:
    return ModeCheck(mode, 1e-4, 1.0, 1e-4, None, meets=meets, capacity=capacity)


def judged(eb: float, mb: float, eb_meets: bool | None = True, mb_meets: bool | None = True) -> Judgement:
    return Judgement.of_checks(check(Mode.EB, eb, eb_meets), check(Mode.MB, mb, mb_meets))


def cap(demand: float, current: float = 1000.0, best: float | None = None) -> ReplicaCapacity:
    best = current if best is None else best
    mode = Mode.EB if best > current else Mode.MB
    return ReplicaCapacity("r", Mode.MB, current, best, mode, demand)


def test_a_replicas_best_capacity_is_its_fastest_mode_that_meets_the_targets() -> None:
    both = ReplicaCapacity.of("r", Mode.MB, judged(eb=1500, mb=1000), load=400, queue_ratio=0.5)
    assert (both.current, both.best, both.best_mode, both.demand) == (1000, 1500, Mode.EB, 400)
    only_mb = ReplicaCapacity.of("r", Mode.MB, judged(eb=1500, mb=1000, eb_meets=False), 400, 0.5)
    assert (only_mb.best, only_mb.best_mode) == (1000, Mode.MB)
    untargeted = ReplicaCapacity.of("r", Mode.EB, judged(900, 1200, None, None), 400, 0.5)
    assert (untargeted.current, untargeted.best) == (900, 1200)
    neither = ReplicaCapacity.of("r", Mode.EB, judged(900, 1200, False, False), 400, 0.5)
    assert (neither.best, neither.best_mode) == (1200, Mode.MB)  # overloaded: the faster mode, and more replicas
    # a queue beyond the batch is demand the replica could not compute; a backlog, not a rate: at most twice
    saturated = ReplicaCapacity.of("r", Mode.MB, judged(eb=1500, mb=1000), load=1000, queue_ratio=1.5)
    assert saturated.demand == 1500
    assert ReplicaCapacity.of("r", Mode.MB, judged(eb=1500, mb=1000), load=1000, queue_ratio=9).demand == 2000


def test_no_plan_no_decision() -> None:
    d = decide([], 3, utilization=0.8, down=0.7)
    assert (d.action, d.target, d.planned) == ("hold", 3, 0)


def test_when_another_mode_would_do_the_policy_is_the_lever() -> None:
    # 2 replicas computing 1,000 tok/s each in MB, 1,500 in EB: 2,000 offered is over 80 % of 2,000 but not of 3,000
    d = decide([cap(1000, 1000, 1500), cap(1000, 1000, 1500)], 2, utilization=0.8, down=0.7)
    assert (d.action, d.target) == ("policy", 2)
    assert "eb" in d.reason and d.best == 3000 and d.current == 2000


def test_when_no_policy_would_do_replicas_are_added_for_the_demand() -> None:
    d = decide([cap(1800, 1000, 1500), cap(1800, 1000, 1500)], 2, utilization=0.8, down=0.7)
    # 3,600 tok/s at 80 % of 1,500 each: 3 replicas
    assert (d.action, d.target) == ("up", 3)
    more = decide([cap(3000), cap(3000)], 2, utilization=0.8, down=0.7)
    assert (more.action, more.target) == ("up", 8)  # 6,000 / 800
    blind = decide([cap(100, 1000, 0.0)], 1, utilization=0.8, down=0.7)  # no capacity priced
    assert (blind.action, blind.target) == ("up", 2)


def test_replicas_asked_for_and_still_starting_count() -> None:
    # two planned replicas need three; Serve already runs (or starts) three: nothing more
    waiting = decide([cap(1800, 1000, 1500), cap(1800, 1000, 1500)], 3, utilization=0.8, down=0.7)
    assert (waiting.action, waiting.target, waiting.planned) == ("hold", 3, 2)
    assert decide([cap(1800, 1000, 1500), cap(1800, 1000, 1500)], 2, utilization=0.8, down=0.7).target == 3
    assert decide([cap(100, 1000, 0.0)], 2, utilization=0.8, down=0.7).action == "hold"


def test_replicas_go_once_fewer_would_still_afford_the_demand_with_room() -> None:
    # 4 replicas of 1,000: one fewer affords 0.7 x 0.8 x 3,000 = 1,680
    assert decide([cap(400)] * 4, 4, utilization=0.8, down=0.7).action == "down"
    d = decide([cap(400)] * 4, 4, utilization=0.8, down=0.7)
    assert d.target == 3  # 1,600 / 560 -> 3
    quiet = decide([cap(50)] * 4, 4, utilization=0.8, down=0.7)
    assert (quiet.action, quiet.target) == ("down", 1)
    assert decide([cap(450)] * 4, 4, utilization=0.8, down=0.7).action == "hold"  # 1,800 > 1,680
    assert decide([cap(50)], 1, utilization=0.8, down=0.7).action == "hold"  # never below one


@pytest.mark.parametrize(("utilization", "down"), [(0.0, 0.5), (1.2, 0.5), (0.8, 1.0), (0.8, 0.0)])
def test_bad_settings_are_refused(utilization: float, down: float) -> None:
    with pytest.raises(ValueError, match="utilization"):
        decide([cap(1)], 1, utilization=utilization, down=down)
