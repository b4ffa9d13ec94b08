"""Policy before replicas in Ray Serve: a custom autoscaling policy that reads the EB+ controller's verdict.

Serve calls a deployment's autoscaling policy in its own controller about once a control-loop period with an
``AutoscalingContext`` and applies what it answers through its delays and bounds (``upscale_delay_s``,
``downscale_delay_s``, ``min_replicas``, ``max_replicas``), as for its own policy. :class:`PolicyFirst` is
that policy for the model replicas (``replicas.autoscaling.policy: policy-first``): it answers with the
replica count :func:`ebplus.controller.scaling.decide` names from what the EB+ controller knows of each
replica (its best mode's capacity under the latency targets, and its demand), so that a fleet whose replicas
could meet the targets in another mode, ``k`` or ``N`` gets that first, and replicas only when no policy on
today's replicas would do.

It never waits on the EB+ controller: each call sends it the running count (``ControllerActor.scaling``,
which decides, records the decision for ``/admin/history`` and, when the policy is the lever, re-plans at
once) and answers with the newest decision that has come back, one call late. Until the first one, and while
the controller does not answer, it holds Serve's current target.

NOTE: Serve ships the class to its controller by value (cloudpickle) and makes one instance per deployment;
its state (the call in flight, the last decision) lives on that instance.
"""

from __future__ import annotations

import json
import logging
from typing import Any

logger = logging.getLogger("ray.serve.ebplus")


class PolicyFirst:
    """Serve's autoscaling policy (``AutoscalingPolicy(policy_function=<this class>, policy_kwargs=...)``).

    Args:
        model: the model id whose replicas it scales (the controller's ``model`` of each replica).
        utilization: the share of their best capacity replicas may run at.
        down: scale down only below this share of what one replica fewer affords.
    """

    def __init__(self, model: str, utilization: float = 0.8, down: float = 0.7) -> None:
        self.model = model
        self.utilization = utilization
        self.down = down
        self._controller: Any = None
        self._pending: Any = None  # the controller's answer in flight
        self.last: dict[str, Any] | None = None  # the newest decision back (ScalingDecision.as_dict)

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        import ray

        from ebplus.controller.actor import get_controller

        if self._pending is not None:
            ready, _ = ray.wait([self._pending], timeout=0)
            if ready:
                try:
                    self.last = json.loads(ray.get(self._pending))
                except Exception as exc:  # a restarting controller: ask again next time
                    logger.warning("policy-first autoscaling: no answer from the EB+ controller (%s)", exc)
                    self._controller = None
                self._pending = None
        if self._pending is None:
            try:
                if self._controller is None:
                    self._controller = get_controller()  # a GCS lookup, not a call to the controller
                if self._controller is not None:
                    self._pending = self._controller.scaling.remote(
                        self.model, ctx.current_num_replicas, self.utilization, self.down
                    )
            except Exception as exc:
                logger.warning("policy-first autoscaling: cannot reach the EB+ controller (%s)", exc)
                self._controller = None
        target = ctx.target_num_replicas if self.last is None else int(self.last["target"])
        return target, ctx.policy_state
