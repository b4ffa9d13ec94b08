"""The chart, run as KubeRay runs it: rendered, started with the operator's rules, deployed, served.

``helm template`` with the CPU example (``helm/ebplus/ci/cpu-values.yaml``, the tiny
builtin model), then :class:`harness.kuberay.LocalKubeRay` does what the KubeRay
operator (v1.7.0) and the kubelet would: the head and worker containers' ``ray start``
lines with their rendered environment (Secrets resolved, the Ray token of
``authOptions``), ``serveConfigV2`` PUT to the dashboard's Serve REST API, polled to
RUNNING. Then what an operator checks on the first day: OpenAI requests with the
official ``openai`` client, the ``helm test`` pod's own command, ``/admin`` and
``/metrics``. Last, the head is lost (every pod killed, as a node failure takes the
head and its workers with it) and the cluster recreated: an override set before is
still there, read from the controller's state volume.

Any wrong env var, import path, arg or port in the chart fails this test; what this
machine cannot reproduce (one IP for all pods, local directories for volumes) is
substituted and every substitution printed (``-s`` shows the transcript).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from external_tools import REPO, binary

from harness.kuberay import KUBERAY_RELEASE, LocalKubeRay, helm_test_command, kubelet_env, render
from harness.waiting import wait_until

CHART = REPO / "helm" / "ebplus"
CPU_VALUES = CHART / "ci" / "cpu-values.yaml"
#: The Secrets docs/kubernetes tells an operator to create before `helm install`.
ADMIN_TOKEN = "kuberay-run-admin-token"
SECRETS = {"ebplus-auth": {"admin-token": ADMIN_TOKEN}, "hf-token": {"token": "hf_not_a_real_token"}}

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def say(text: str) -> None:
    print(f"[kuberay] {text}", flush=True)


def _by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d.get("kind") == kind]


def test_the_cpu_example_runs_as_kuberay_runs_it() -> None:
    docs = render(binary("helm", "HELM"), CHART, "eb", [CPU_VALUES], {"hf.existingSecret": "hf-token"})
    (rayservice,) = _by_kind(docs, "RayService")
    (test_pod,) = [d for d in _by_kind(docs, "Pod") if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]
    kuberay = LocalKubeRay(rayservice, SECRETS, Path(sys.executable).parent)
    say(f"rules of KubeRay {KUBERAY_RELEASE}; pods: head + {sum(int(g.get('replicas', 1)) for g in rayservice['spec']['rayClusterConfig'].get('workerGroupSpecs', []))} worker(s)")
    with kuberay.running():
        t_cluster = time.monotonic()
        for pod in kuberay.pods:
            say(f"{pod.name} ({pod.group}): {pod.command}")
            say(f"{pod.name} env: RAY_AUTH_MODE={pod.env.get('RAY_AUTH_MODE')} HF_TOKEN set={'HF_TOKEN' in pod.env} "
                f"HF_HOME={pod.env.get('HF_HOME')}")  # fmt: skip
            assert pod.env.get("RAY_AUTH_MODE") == "token", f"{pod.name}: Ray token auth is off"
            assert pod.env.get("HF_TOKEN") == SECRETS["hf-token"]["token"], f"{pod.name}: HF_TOKEN not from the Secret"
            assert pod.env.get("HF_HOME"), f"{pod.name}: no model cache"
        running_s = kuberay.deploy()
        say(f"serveConfigV2 PUT -> RUNNING in {running_s:.0f} s")
        base = f"http://127.0.0.1:{kuberay.ports['serve']}"
        model_id = yaml_model_id(rayservice)
        served = _serve_requests(base, model_id)
        say(f"OpenAI client: {served} requests answered")

        # the helm-test pod's own command against the Serve Service
        env = {**os.environ, **kubelet_env(test_pod["spec"]["containers"][0], SECRETS)}
        proc = subprocess.run(helm_test_command(test_pod, base), env=env, capture_output=True, text=True, timeout=120)
        say(f"helm test command: exit {proc.returncode}: {proc.stdout.strip().splitlines()[-1:] or proc.stderr[-300:]}")
        assert proc.returncode == 0, proc.stdout + proc.stderr

        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        assert httpx.get(f"{base}/admin/thresholds", timeout=10).status_code == 401
        assert httpx.get(f"{base}/admin/thresholds", headers=admin, timeout=10).status_code == 200
        metrics = httpx.get(f"{base}/metrics", timeout=10)
        assert metrics.status_code == 200 and "ebplus_controller_up" in metrics.text
        # the Ray dashboard refuses a caller without the Ray token
        bare = httpx.get(f"http://127.0.0.1:{kuberay.ports['dashboard']}/api/serve/applications/", timeout=10)
        say(f"dashboard without the Ray token: {bare.status_code}")
        assert bare.status_code in (401, 403)

        answer = httpx.put(f"{base}/admin/overrides", json={"replica": "*", "k": 3}, headers=admin, timeout=30)
        assert answer.status_code == 200 and answer.json().get("persisted") is True, answer.text
        say(f"override set: {answer.json()}")
        say(f"first deployment: {time.monotonic() - t_cluster:.0f} s from the pods' start")

        # the head is lost: KubeRay recreates the pods and submits serveConfigV2 again
        kuberay.stop_pods()
        t_restart = time.monotonic()
        kuberay.start_pods()
        again_s = kuberay.deploy()
        say(f"head lost and recreated: RUNNING again in {time.monotonic() - t_restart:.0f} s (deploy {again_s:.0f} s)")
        base = f"http://127.0.0.1:{kuberay.ports['serve']}"
        thresholds = httpx.get(f"{base}/admin/thresholds", headers=admin, timeout=10).json()
        say(f"overrides after the restart: {thresholds['overrides']}")
        assert any(o.get("k") == 3 for o in _overrides(thresholds)), thresholds
        assert _serve_requests(base, model_id, n=2) == 2
    for line in kuberay.substitutions:
        say(f"substitution: {line}")


def yaml_model_id(rayservice: dict) -> str:
    import yaml

    (app,) = yaml.safe_load(rayservice["spec"]["serveConfigV2"])["applications"]
    return app["args"]["model"]["id"]


def _overrides(thresholds: dict) -> list[dict]:
    found = thresholds.get("overrides") or {}
    return list(found.values()) if isinstance(found, dict) else list(found)


def _serve_requests(base: str, model_id: str, n: int = 4) -> int:
    """``n`` requests with the official client (the last one streamed); how many were answered."""
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="not-needed", timeout=120, max_retries=0)
    wait_until(f"{model_id} in /v1/models", lambda: model_id in [m.id for m in client.models.list().data], 60)
    done = 0
    for i in range(n - 1):
        out = client.completions.create(model=model_id, prompt=f"def f_{i}(x):", max_tokens=8)
        done += bool(out.choices and out.choices[0].text is not None)
    chunks = list(client.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "hello"}], max_tokens=8, stream=True))  # fmt: skip
    done += bool(chunks)
    return done
