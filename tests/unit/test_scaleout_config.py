"""Placement, autoscaling and draining in the deployment config: validated, and passed to Ray as given."""

from __future__ import annotations

from pathlib import Path

import pytest

from ebplus.controller.actor import controller_options
from ebplus.controller.config import HEAD_NODE_RESOURCE, ControllerConfig
from ebplus.deploy.config import ConfigError, load_config, parse_config

ROOT = Path(__file__).resolve().parents[2]
CPU = {"engine": {"cpu_kv_cache_gib": 1}, "replicas": {"accelerator": "cpu"}}


def replicas(**section: object) -> dict:
    return {**CPU, "replicas": {"accelerator": "cpu", **section}}


def test_fixed_replicas_deploy_as_a_count_with_a_long_drain() -> None:
    options = parse_config(replicas(num_replicas=3, resources={"ebplus-replica": 1})).replicas.deployment_options()
    assert options["num_replicas"] == 3 and "autoscaling_config" not in options
    assert options["ray_actor_options"] == {"num_cpus": 1.0, "resources": {"ebplus-replica": 1.0}}
    # Serve's default of 20 s would cut off a long generation on a scale-down or a rolling update
    assert options["graceful_shutdown_timeout_s"] == 300.0 and options["graceful_shutdown_wait_loop_s"] == 1.0


def test_autoscaling_passes_only_what_is_set() -> None:
    cfg = parse_config(
        replicas(autoscaling={"min_replicas": 2, "max_replicas": 4, "target_ongoing_requests": 6, "downscale_delay_s": 30})
    )
    options = cfg.replicas.deployment_options()
    assert "num_replicas" not in options
    assert options["autoscaling_config"] == {
        "min_replicas": 2,
        "max_replicas": 4,
        "target_ongoing_requests": 6.0,
        "downscale_delay_s": 30.0,
    }


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (replicas(autoscaling={"min_replicas": 3, "max_replicas": 2, "target_ongoing_requests": 4}),
         "replicas.autoscaling: min_replicas (3) must be <= max_replicas (2)"),
        (replicas(autoscaling={"max_replicas": 4, "initial_replicas": 5, "target_ongoing_requests": 4}),
         "replicas.autoscaling: initial_replicas (5) must lie in [min_replicas, max_replicas]"),
        (replicas(autoscaling={"max_replicas": 4}), "replicas.autoscaling.target_ongoing_requests: Field required"),
        (replicas(num_replicas=2, autoscaling={"max_replicas": 4, "target_ongoing_requests": 4}),
         "replicas: num_replicas must be left unset with autoscaling"),
        (replicas(autoscaling={"max_replicas": 2, "target_ongoing_requests": 0}),
         "replicas.autoscaling.target_ongoing_requests: Input should be greater than 0"),
        (replicas(resources={"CPU": 1}), "replicas.resources: 'CPU' is a built-in Ray resource"),
        (replicas(resources={"ebplus-replica": -1}), "replicas.resources.ebplus-replica: Input should be greater than 0"),
        ({**CPU, "http": {"ingress_resources": {"": 1}}}, "http.ingress_resources: a resource name must not be empty"),
        ({**CPU, "controller": {"placement": "moon"}}, "controller.placement: Input should be 'head' or 'any'"),
        ({**CPU, "controller": {"resources": {"GPU": 1}}}, "'GPU' is a built-in Ray resource"),
    ],
)  # fmt: skip
def test_bad_placement_and_autoscaling_name_the_field(data: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(data, "x.yaml")
    assert needle in str(err.value), str(err.value)


def test_controller_goes_to_the_head_unless_told_otherwise() -> None:
    assert controller_options(ControllerConfig())["resources"] == {HEAD_NODE_RESOURCE: 0.001}
    anywhere = ControllerConfig(placement="any", resources={"ebplus-controller": 0.01})
    assert controller_options(anywhere)["resources"] == {"ebplus-controller": 0.01}
    both = ControllerConfig(resources={"cpu-pool": 1})
    assert controller_options(both)["resources"] == {"cpu-pool": 1, HEAD_NODE_RESOURCE: 0.001}
    assert controller_options(ControllerConfig(max_restarts=3))["max_restarts"] == 3


def test_the_multinode_test_config_keeps_replicas_off_the_head() -> None:
    cfg = load_config(ROOT / "tests" / "e2e" / "multinode.yaml")
    assert cfg.replicas.resources and cfg.http.ingress_resources and cfg.controller.placement == "any"



def test_the_default_placement_test_config_pins_nothing() -> None:
    """tests/e2e/test_scaleout_default.py must run what a user gets by default: only the sizes differ, the
    engines' priority (Ray's, not 19: the emulated nodes share two cores, which a real cluster's do not) and
    the ingress's replicas (two, so that losing a node does not wait for a new ingress: see the config)."""
    cfg = load_config(ROOT / "tests" / "e2e" / "multinode-default.yaml")
    defaults = parse_config(CPU, "defaults")
    assert not cfg.replicas.resources and not cfg.http.ingress_resources
    assert cfg.controller.placement == defaults.controller.placement and not cfg.controller.resources
    assert cfg.http.proxy_location == defaults.http.proxy_location == "EveryNode"
    assert cfg.http.ingress_replicas == 2 and defaults.http.ingress_replicas == 1
    assert cfg.http.ingress_num_cpus == defaults.http.ingress_num_cpus
    assert cfg.replicas.engine_niceness == "inherit" and defaults.replicas.engine_niceness == "auto"
