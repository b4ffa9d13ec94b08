"""The benchmark most vLLM users run first, against the live deployment: every request ends at its cap.

``vllm bench serve --dataset-name random --ignore-eos`` (its own code) at range ratio
0 and 0.5, 64 requests each. The controller's estimate must follow the realized
output lengths (the caps), not collapse: without a departure model for capped
requests the window is all censored, and the fit falls back to a tiny p0 (a mean
output hundreds of times the caps) and theta* to its floor.
"""

from __future__ import annotations

import time

import httpx
import pytest

from benchmarks.e2e_bench import random_dataset, serving_benchmark
from ebplus.controller import theory
from ebplus.deploy.app import model_path

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

OUTPUT_LEN = 16  # the caps
INPUT_LEN = 64  # short prompts: the estimate under test is of output lengths, and prefill is most of a run's time


def estimate_now(deployment) -> dict:
    """Re-estimate on the window as it is (an operator's POST /admin/recompute) and read the fleet estimate.

    The window (``controller.window: 60`` in e2e.yaml) then holds this run's requests only.
    """
    time.sleep(1.0)  # the last completions reach the controller with the next telemetry push
    r = httpx.post(f"{deployment.base_url}/admin/recompute", headers=deployment.admin_headers, timeout=30)
    r.raise_for_status()
    return deployment.admin("/admin/estimates")["fleet"]


@pytest.mark.parametrize("range_ratio", [0.0, 0.5])
def test_capped_traffic_is_estimated_from_its_caps(deployment, tmp_path, range_ratio: float) -> None:
    served = deployment.config
    before = deployment.admin("/admin/estimates")["fleet"]["updates"]
    result = serving_benchmark(
        deployment.base_url,
        served.model.id,
        model_path(served),
        random_dataset(INPUT_LEN, OUTPUT_LEN, range_ratio),
        num_prompts=64,
        max_concurrency=16,
        result_dir=tmp_path,
        name=f"random-{range_ratio}",
    )
    assert result["completed"] == 64
    measured = result["total_output_tokens"] / result["completed"]
    fleet = estimate_now(deployment)
    est = fleet["estimate"]
    print(f"\nrange ratio {range_ratio}: measured mean output {measured:.1f}; estimate {est}")
    assert fleet["updates"] > before
    assert est["model"] == "caps" and est["capped_share"] == pytest.approx(1.0)
    assert est["mu_o"] == pytest.approx(measured, rel=0.10)
    assert 1.0 / est["p0"] == pytest.approx(measured, rel=0.10)  # the departure rate the closed forms use
    replica = next(iter(deployment.admin("/admin/thresholds")["replicas"].values()))
    reason = replica["reason"]  # k is theta x N, or the latency rule's pick below it
    assert reason.startswith((f"k {replica['k']} = theta", f"k {replica['k']} by latency")), reason
    assert f"N {replica['n']} = " in reason
    if range_ratio > 0:
        assert replica["theta_star"] > theory.THETA_MIN  # off its floor
