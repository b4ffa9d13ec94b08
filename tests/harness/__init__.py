"""The reliability harness: a live deployment, a Ray driver for real faults, an OpenAI load, hostile requests.

Used by ``tests/e2e/test_reliability.py`` and ``tests/e2e/test_scaleout.py`` (short runs
with assertions) and by ``benchmarks/reliability_bench.py`` and ``benchmarks/scaleout_bench.py``
(longer runs that write the Reliability and Scale-out tables).
Every fault is real: the controller actor is killed with ``ray.kill`` (Ray
restarts it) or stopped with SIGSTOP; a model replica's process gets SIGKILL; a worker node
of a multi-node cluster loses its raylet and everything under it.
All traffic goes to loopback; every wait has a deadline.

One module per concern:

- :mod:`.deployment`: ``ebplus serve`` started, attached to, waited for and stopped;
- :mod:`.cluster`: the Ray driver that injects the faults and reads replica state;
- :mod:`.nodes`: a multi-node Ray cluster on this machine, whose nodes can be lost;
- :mod:`.multinode`: the layout of that cluster and the config updates of the scale-out runs;
- :mod:`.kuberay`: the chart's RayService run as the KubeRay operator and the kubelet would run it;
- :mod:`.fleet`: the fleet as the controller sees it (healthy, converged; counters);
- :mod:`.load`: the OpenAI client load (closed-loop or open-loop Poisson) and what it saw;
- :mod:`.faults`, :mod:`.overload`, :mod:`.hostile`, :mod:`.nodeloss`, :mod:`.rollout`: the scenarios, each returning
  plain figures (JSON-able) that the tests assert on and the benchmark tabulates;
- :mod:`.campaign`, :mod:`.campaign_faults`: the probes of the hostile campaign (``make bench-hostile``) and what
  it records of each;
- :mod:`.plugin`: EB+ inside vLLM's own OpenAI server (``vllm serve`` with the plugins), started and stopped;
- :mod:`.waiting`: :func:`wait_until` and :class:`HarnessError`.

This module re-exports what the tests and benchmarks use.
"""

from harness.cluster import Cluster
from harness.deployment import (
    FAULTS_CONFIG,
    Deployment,
    attach_deployment,
    deployed,
    start_deployment,
    stop_deployment,
)
from harness.faults import scenario_controller_kills, scenario_hung_controller, scenario_replica_kill
from harness.hostile import (
    listeners,
    scenario_abandoned,
    scenario_bad_telemetry,
    scenario_fuzz,
    scenario_hostile,
    scenario_secrets,
)
from harness.overload import scenario_back_pressure, scenario_soak
from harness.waiting import HarnessError, wait_until

__all__ = [
    "FAULTS_CONFIG",
    "Cluster",
    "Deployment",
    "HarnessError",
    "attach_deployment",
    "deployed",
    "listeners",
    "scenario_abandoned",
    "scenario_back_pressure",
    "scenario_bad_telemetry",
    "scenario_controller_kills",
    "scenario_fuzz",
    "scenario_hostile",
    "scenario_hung_controller",
    "scenario_replica_kill",
    "scenario_secrets",
    "scenario_soak",
    "start_deployment",
    "stop_deployment",
    "wait_until",
]
