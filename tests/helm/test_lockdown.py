"""What a first ``helm install`` gets without asking: a Hub model that loads, and a locked-down cluster.

Every check reads ``helm template`` output (the cases of ``test_chart.py``), plus what the KubeRay
operator (v1.7.0, ``ray-operator/controllers/ray/common/pod.go``) adds to the pods it builds from
it: the autoscaler sidecar (from ``autoscalerOptions``) and the workers' ``wait-gcs-ready`` init
container (the Ray container's securityContext, env and mounts, copied).

* the model: a local path nothing mounts is refused at template time, in one line; HF_TOKEN
  from a ``secretKeyRef`` and HF_HOME on the cache volume on every Ray container;
* Pod Security "restricted" on every container of every pod template of every case, by a
  checker written here from the standard (with a self-test, so that its passing means
  something), a read-only root filesystem, no service-account token but where the autoscaler
  needs one;
* the NetworkPolicy, evaluated the way the API server's semantics define it: Ray's control
  plane reachable only from the release, the operator and Prometheus;
* Ray token auth, the benchmarked serving plane, stable renders, the controller's state
  volume, GCS fault tolerance and the Ingress.
"""

from __future__ import annotations

import copy
import functools
import subprocess
from pathlib import Path

import pytest
import yaml
from external_tools import binary
from test_chart import CASES, CHART, NAMESPACE, RELEASE, by_kind, merged_values, render, run_helm

from docgen import helm_values
from ebplus.deploy.config import parse_config
from ebplus.deploy.serve_env import SERVE_ENV

FULLNAME = f"{RELEASE}-ebplus"
CONTROL_PLANE_PORTS = (6379, 8265, 10001)


@pytest.fixture(scope="module")
def helm() -> str:
    return binary("helm", "HELM")


def template(helm: str, *args: str) -> subprocess.CompletedProcess:
    return run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args)


@functools.cache
def render_with(helm: str, case: str, *sets: str) -> list[dict]:
    """A case rendered with extra ``--set`` values."""
    args = [] if CASES[case] is None else ["-f", str(CASES[case])]
    for item in sets:
        args += ["--set", item]
    proc = template(helm, *args)
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def rayservice(docs: list[dict]) -> dict:
    (rs,) = by_kind(docs)["RayService"]
    return rs


def app_args(docs: list[dict]) -> dict:
    (app,) = yaml.safe_load(rayservice(docs)["spec"]["serveConfigV2"])["applications"]
    return app["args"]


def ray_pods(docs: list[dict]) -> dict[str, dict]:
    """Pod template per Ray group (``head``, then each worker group's name)."""
    cluster = rayservice(docs)["spec"]["rayClusterConfig"]
    pods = {"head": cluster["headGroupSpec"]["template"]}
    pods.update({g["groupName"]: g["template"] for g in cluster["workerGroupSpecs"]})
    return pods


def ray_containers(docs: list[dict]) -> dict[str, dict]:
    return {group: pod["spec"]["containers"][0] for group, pod in ray_pods(docs).items()}


def env_of(container: dict) -> dict[str, dict]:
    names = [e["name"] for e in container.get("env", [])]
    assert len(names) == len(set(names)), f"{container['name']}: a variable rendered twice: {names}"
    return {e["name"]: e for e in container.get("env", [])}


def operator_pod_specs(docs: list[dict]) -> dict[str, dict]:
    """Every pod spec that runs, as KubeRay would build it: the chart's Ray pod templates with the
    autoscaler sidecar added to the head (autoscalerOptions) and wait-gcs-ready to each worker, and
    the helm-test pod."""
    cluster = rayservice(docs)["spec"]["rayClusterConfig"]
    specs = {}
    for group, pod in ray_pods(docs).items():
        spec = copy.deepcopy(pod["spec"])
        ray = spec["containers"][0]
        if group == "head" and cluster["enableInTreeAutoscaling"]:
            options = cluster.get("autoscalerOptions", {})
            sidecar = {"name": "autoscaler", "image": ray["image"]}
            if "securityContext" in options:
                sidecar["securityContext"] = copy.deepcopy(options["securityContext"])
            spec["containers"].append(sidecar)
        if group != "head":
            init = {"name": "wait-gcs-ready", "image": ray["image"]}
            if "securityContext" in ray:
                init["securityContext"] = copy.deepcopy(ray["securityContext"])
            spec.setdefault("initContainers", []).append(init)
        specs[f"RayService/{rayservice(docs)['metadata']['name']} {group}"] = spec
    for pod in by_kind(docs).get("Pod", []):
        specs[f"Pod/{pod['metadata']['name']}"] = pod["spec"]
    return specs


# -- Pod Security Standards -------------------------------------------------------------
# https://kubernetes.io/docs/concepts/security/pod-security-standards/ : the baseline and restricted
# controls that apply to a pod spec (the Windows-only and annotation-only ones need nothing here).

RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
}  # fmt: skip
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}  # fmt: skip
SELINUX_TYPES = {None, "", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}


def pss_restricted_violations(spec: dict, where: str) -> list[str]:
    """Why ``spec`` (a PodSpec) fails Pod Security "restricted" (which includes baseline); empty: it passes."""
    bad = []
    pod_sc = spec.get("securityContext") or {}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            bad.append(f"{where}: {key}")
    for volume in spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            bad.append(f"{where}: volume {volume['name']} of type {sorted(kinds - RESTRICTED_VOLUMES)}")
    for sysctl in pod_sc.get("sysctls", []):
        if sysctl["name"] not in SAFE_SYSCTLS:
            bad.append(f"{where}: sysctl {sysctl['name']}")

    def profile_problems(sc: dict, name: str) -> list[str]:
        out = []
        seccomp = (sc.get("seccompProfile") or {}).get("type")
        if seccomp == "Unconfined":
            out.append(f"{name}: seccompProfile Unconfined")
        apparmor = (sc.get("appArmorProfile") or {}).get("type")
        if apparmor not in (None, "RuntimeDefault", "Localhost"):
            out.append(f"{name}: appArmorProfile {apparmor}")
        selinux = sc.get("seLinuxOptions") or {}
        if selinux.get("type") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
            out.append(f"{name}: seLinuxOptions {selinux}")
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            out.append(f"{name}: windowsOptions.hostProcess")
        return out

    bad += profile_problems(pod_sc, where)
    if pod_sc.get("runAsUser") == 0:
        bad.append(f"{where}: pod runAsUser 0")
    containers = [*spec.get("initContainers", []), *spec.get("containers", []), *spec.get("ephemeralContainers", [])]
    if not containers:
        bad.append(f"{where}: no containers")
    for container in containers:
        name = f"{where}/{container['name']}"
        sc = container.get("securityContext") or {}
        bad += profile_problems(sc, name)
        if sc.get("privileged"):
            bad.append(f"{name}: privileged")
        if sc.get("procMount") not in (None, "Default"):
            bad.append(f"{name}: procMount {sc['procMount']}")
        for port in container.get("ports", []):
            if port.get("hostPort"):
                bad.append(f"{name}: hostPort {port['hostPort']}")
        if sc.get("allowPrivilegeEscalation") is not False:
            bad.append(f"{name}: allowPrivilegeEscalation is not false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            bad.append(f"{name}: capabilities.drop lacks ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            bad.append(f"{name}: capabilities.add {caps['add']}")
        # a container's own setting wins over the pod's
        non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
        if non_root is not True:
            bad.append(f"{name}: runAsNonRoot is not true")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            bad.append(f"{name}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            bad.append(f"{name}: seccompProfile {seccomp!r}, not RuntimeDefault or Localhost")
    return bad


def pss_check(docs: list[dict]) -> list[str]:
    """Every container of every pod that would run, checked; returns their names (fails on a violation)."""
    checked, bad = [], []
    for where, spec in operator_pod_specs(docs).items():
        bad += pss_restricted_violations(spec, where)
        checked += [f"{where}/{c['name']}" for c in [*spec.get("initContainers", []), *spec["containers"]]]
    assert not bad, "\n".join(bad)
    return checked


def test_the_pss_checker_rejects_bad_pods(helm: str) -> None:
    """Each control fails a container (or pod) that breaks it: the checker can fail."""
    (spec,) = [s for w, s in operator_pod_specs(render(helm, "default")).items() if w.endswith(" head")]
    assert pss_restricted_violations(spec, "ok") == []
    breakers = {
        "hostNetwork": lambda s: s.update(hostNetwork=True),
        "hostPath": lambda s: s["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
        "privileged": lambda c: c["securityContext"].update(privileged=True),
        "allowPrivilegeEscalation": lambda c: c["securityContext"].pop("allowPrivilegeEscalation"),
        "capabilities.drop": lambda c: c["securityContext"].update(capabilities={"drop": ["NET_RAW"]}),
        "capabilities.add": lambda c: c["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]),
        "runAsNonRoot": lambda c: c["securityContext"].update(runAsNonRoot=False),
        "runAsUser 0": lambda c: c["securityContext"].update(runAsUser=0),
        "seccompProfile": lambda c: c["securityContext"].update(seccompProfile={"type": "Unconfined"}),
        "hostPort": lambda c: c["ports"].append({"containerPort": 1, "hostPort": 80}),
    }
    for control, breaks in breakers.items():
        broken = copy.deepcopy(spec)
        target = broken if control in ("hostNetwork", "hostPath") else broken["containers"][0]
        breaks(target)
        assert pss_restricted_violations(broken, "bad"), f"the checker let {control} pass"
    # the pod-level defaults alone do not make a bare container pass (no drop ALL, no allowPrivilegeEscalation)
    bare = copy.deepcopy(spec)
    bare["containers"].append({"name": "sidecar", "image": "x"})
    assert len(pss_restricted_violations(bare, "bad")) == 2


@pytest.mark.parametrize("case", CASES)
def test_every_container_meets_pss_restricted(helm: str, case: str) -> None:
    docs = render(helm, case)
    checked = pss_check(docs)
    print(f"{case}: PSS restricted, {len(checked)} containers: {', '.join(checked)}")
    groups = ray_pods(docs)
    assert len(checked) == 2 * len(groups) + int(merged_values(case).helmTest.enabled) - 1 + int(
        rayservice(docs)["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"]
    )  # head + (worker + its init container) per group + the test pod + the autoscaler


@pytest.mark.parametrize("case", CASES)
def test_read_only_root_and_writable_paths(helm: str, case: str) -> None:
    docs = render(helm, case)
    values = merged_values(case)
    for where, spec in operator_pod_specs(docs).items():
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            assert container["securityContext"]["readOnlyRootFilesystem"] is True, f"{where}/{container['name']}"
    for group, container in ray_containers(docs).items():
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert set(values.writablePaths) <= set(mounts), group
        assert "/home/ray" not in mounts  # Python lives under it
        volumes = {v["name"]: v for v in ray_pods(docs)[group]["spec"]["volumes"]}
        assert all(volumes[mounts[p]] == {"name": mounts[p], "emptyDir": {}} for p in values.writablePaths)


@pytest.mark.parametrize("case", CASES)
def test_service_account_token_only_for_the_autoscaler(helm: str, case: str) -> None:
    docs = render(helm, case)
    autoscaling = rayservice(docs)["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"]
    for where, spec in operator_pod_specs(docs).items():
        expected = autoscaling and where.endswith(" head")
        assert spec["automountServiceAccountToken"] is expected, where
    if autoscaling:
        options = rayservice(docs)["spec"]["rayClusterConfig"]["autoscalerOptions"]
        assert options["securityContext"] == merged_values(case).securityContext
        assert {m["mountPath"] for m in options["volumeMounts"]} == set(merged_values(case).writablePaths)


# -- the model ----------------------------------------------------------------------------


LOCAL_REFUSAL = (
    "config.model.source is a local path ({}) but nothing mounts it: set modelStorage.enabled=true and "
    "modelStorage.existingClaim, or use a Hugging Face Hub id such as Qwen/Qwen3-8B"
)


@pytest.mark.parametrize("source", ["/models/Qwen3-8B", "./models/qwen", "~/qwen"])
def test_a_local_path_nothing_mounts_is_refused_in_one_line(helm: str, source: str) -> None:
    proc = template(helm, "--set", f"config.model.source={source}")
    assert proc.returncode != 0
    # one line (helm's own hint about --debug aside), the template's `fail` message after helm's prefix
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("Use --debug")]
    assert line.endswith("): " + LOCAL_REFUSAL.format(source)), line
    ok = template(helm, "--set", f"config.model.source={source}", "--set", "modelStorage.enabled=true",
                  "--set", "modelStorage.existingClaim=models")  # fmt: skip
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize("source", ["Qwen/Qwen3-8B", "hf://Qwen/Qwen3-8B", "builtin:tiny"])
def test_hub_ids_and_builtins_are_not_local(helm: str, source: str) -> None:
    proc = template(helm, "--set", f"config.model.source={source}",
                    "--set", "config.model.cache_dir=/home/ray/.cache/ebplus-models")  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def test_the_default_model_is_a_hub_id(helm: str) -> None:
    assert app_args(render(helm, "default"))["model"]["source"] == "Qwen/Qwen3-8B"


def test_hf_token_from_a_secret_on_every_ray_container(helm: str) -> None:
    """A Hub id with hf.existingSecret: HF_TOKEN from a secretKeyRef on the head and every worker group."""
    docs = render_with(helm, "mixed-fleet", "config.model.source=Qwen/Qwen3-8B", "hf.existingSecret=hf-token")
    containers = ray_containers(docs)
    assert set(containers) == {"head", "h200", "l40s"}
    for group, container in containers.items():
        env = env_of(container)
        assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}
        print(f"{group}: HF_TOKEN <- secretKeyRef {env['HF_TOKEN']['valueFrom']['secretKeyRef']}")
    (test_pod,) = by_kind(docs)["Pod"]
    assert "HF_TOKEN" not in env_of(test_pod["spec"]["containers"][0])
    assert not [s for s in by_kind(docs).get("Secret", []) if s["metadata"]["name"].endswith("-hf")]
    # no token configured: no HF_TOKEN (public models)
    assert all("HF_TOKEN" not in env_of(c) for c in ray_containers(render(helm, "default")).values())


def test_an_inline_hf_token_goes_into_a_secret(helm: str) -> None:
    docs = render_with(helm, "default", "hf.token=hf_inline")
    (secret,) = [s for s in by_kind(docs)["Secret"] if s["metadata"]["name"] == f"{FULLNAME}-hf"]
    assert secret["data"] == {"token": "aGZfaW5saW5l"}  # base64 of hf_inline
    for container in ray_containers(docs).values():
        assert "value" not in env_of(container)["HF_TOKEN"]
        assert env_of(container)["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": f"{FULLNAME}-hf", "key": "token"}


@pytest.mark.parametrize("case", CASES)
def test_the_model_cache_on_every_ray_pod(helm: str, case: str) -> None:
    docs = render(helm, case)
    cache = merged_values(case).hf.cache
    for group, container in ray_containers(docs).items():
        assert env_of(container)["HF_HOME"] == {"name": "HF_HOME", "value": cache.mountPath}
        assert {"name": "hf-cache", "mountPath": cache.mountPath} in container["volumeMounts"]
        (volume,) = [v for v in ray_pods(docs)[group]["spec"]["volumes"] if v["name"] == "hf-cache"]
        assert volume["emptyDir"] == {"sizeLimit": cache.sizeLimit}
    claimed = render_with(helm, "default", "hf.cache.existingClaim=hf-cache")
    for pod in ray_pods(claimed).values():
        (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "hf-cache"]
        assert volume == {"name": "hf-cache", "persistentVolumeClaim": {"claimName": "hf-cache"}}


# -- network ------------------------------------------------------------------------------


def selects(selector: dict | None, labels: dict[str, str]) -> bool:
    """A LabelSelector matching ``labels`` (an empty selector matches everything)."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {"In": key in labels and labels[key] in values, "NotIn": labels.get(key) not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[op]  # fmt: skip
        if not ok:
            return False
    return True


def admits(policy: dict, target: dict[str, str], peer: dict[str, str], peer_ns: dict[str, str], port: int) -> bool:
    """Whether a NetworkPolicy admits a connection from a pod (labels, namespace labels) to ``port`` of ``target``."""
    spec = policy["spec"]
    if not selects(spec["podSelector"], target) or "Ingress" not in spec["policyTypes"]:
        return True  # not isolated by this policy
    same_ns = peer_ns.get("kubernetes.io/metadata.name") == NAMESPACE
    for rule in spec.get("ingress", []):
        if rule.get("ports") and port not in [p["port"] for p in rule["ports"]]:
            continue
        peers = rule.get("from")
        if not peers:
            return True
        for p in peers:
            in_ns = selects(p["namespaceSelector"], peer_ns) if "namespaceSelector" in p else same_ns
            if in_ns and ("podSelector" not in p or selects(p["podSelector"], peer)):
                return True
    return False


def network_policy(docs: list[dict]) -> dict:
    (policy,) = by_kind(docs)["NetworkPolicy"]
    return policy


NS = {"kubernetes.io/metadata.name": NAMESPACE}
OTHER_NS = {"kubernetes.io/metadata.name": "tenant-a"}
OPERATOR = ({"app.kubernetes.io/name": "kuberay-operator"}, {"kubernetes.io/metadata.name": "kuberay-system"})
PROMETHEUS = ({"app.kubernetes.io/name": "prometheus"}, {"kubernetes.io/metadata.name": "monitoring"})
INGRESS_NGINX = ({"app.kubernetes.io/name": "ingress-nginx"}, {"kubernetes.io/metadata.name": "ingress-nginx"})


@pytest.mark.parametrize("case", CASES)
def test_network_policy_closes_the_control_plane(helm: str, case: str) -> None:
    docs = render(helm, case)
    policy = network_policy(docs)
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress open: Hub downloads
    own = {"app.kubernetes.io/name": "ebplus", "app.kubernetes.io/instance": RELEASE, "app.kubernetes.io/component": "test"}
    http, metrics = parse_config(app_args(docs)).http.port, parse_config(app_args(docs)).ray.metrics_export_port
    serve_from = merged_values(case).networkPolicy.serve.from_
    for group, pod in ray_pods(docs).items():
        target = pod["metadata"]["labels"]
        assert selects(policy["spec"]["podSelector"], target), f"the policy does not select the {group} pod"
        for port in CONTROL_PLANE_PORTS:
            assert not admits(policy, target, {"app": "anything"}, OTHER_NS, port), (group, port)
            assert not admits(policy, target, {"app": "anything"}, NS, port), (group, port)
            assert admits(policy, target, own, NS, port)  # the release's own pods (helm test, Ray)
        assert admits(policy, target, *OPERATOR, 8265) and admits(policy, target, *OPERATOR, 52365)
        assert not admits(policy, target, *OPERATOR, 6379)
        assert admits(policy, target, *PROMETHEUS, metrics) and admits(policy, target, *PROMETHEUS, http)
        assert not admits(policy, target, *PROMETHEUS, 6379)
        assert admits(policy, target, {"app": "anything"}, OTHER_NS, http) == (not serve_from)
        if merged_values(case).ingress.enabled:
            assert admits(policy, target, *INGRESS_NGINX, http), "the ingress controller cannot reach Serve"
    # the chart's own Services publish the Serve port only (KubeRay's head Service is the operator's)
    for service in by_kind(docs).get("Service", []):
        assert not {p["port"] for p in service["spec"]["ports"]} & set(CONTROL_PLANE_PORTS), service["metadata"]["name"]
    for port in rayservice(docs)["spec"]["serveService"]["spec"]["ports"]:
        assert port["port"] == http


def test_network_policy_off(helm: str) -> None:
    assert "NetworkPolicy" not in by_kind(render_with(helm, "default", "networkPolicy.enabled=false"))


def test_network_policy_peer_namespaces(helm: str) -> None:
    """namespaceSelector null: the operator's pods in the release's namespace only."""
    policy = network_policy(render_with(helm, "default", "networkPolicy.operator.namespaceSelector=null"))
    head = ray_pods(render(helm, "default"))["head"]["metadata"]["labels"]
    assert admits(policy, head, OPERATOR[0], NS, 8265) and not admits(policy, head, *OPERATOR, 8265)


# -- Ray auth, serving plane, renders ----------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_ray_token_auth_on(helm: str, case: str) -> None:
    cluster = rayservice(render(helm, case))["spec"]["rayClusterConfig"]
    assert cluster["authOptions"] == {"mode": "token"}  # KubeRay generates the token's Secret
    cluster = rayservice(render_with(helm, case, "rayAuth.existingSecret=ray-token"))["spec"]["rayClusterConfig"]
    assert cluster["authOptions"] == {"mode": "token", "secretName": "ray-token"}
    assert "authOptions" not in rayservice(render_with(helm, case, "rayAuth.enabled=false"))["spec"]["rayClusterConfig"]


def test_ray_token_auth_needs_ray_2_52(helm: str) -> None:
    proc = template(helm, "--set", "rayService.rayVersion=2.49.0")
    assert proc.returncode != 0 and "rayAuth.enabled needs Ray >= 2.52.0" in proc.stderr


@pytest.mark.parametrize("case", CASES)
def test_serving_plane_is_the_benchmarked_one(helm: str, case: str) -> None:
    for container in ray_containers(render(helm, case)).values():
        env = env_of(container)
        assert {k: env[k].get("value") for k in SERVE_ENV} == SERVE_ENV
    for container in ray_containers(render_with(helm, case, "servingPlane.tuned=false")).values():
        assert not set(SERVE_ENV) & set(env_of(container))


def test_a_groups_own_env_wins(helm: str) -> None:
    proc = template(helm, "--set-string", "head.env[0].name=RAY_SERVE_ENABLE_HA_PROXY,head.env[0].value=1")
    assert proc.returncode == 0, proc.stderr
    docs = [doc for doc in yaml.safe_load_all(proc.stdout) if doc]
    head = env_of(ray_containers(docs)["head"])  # env_of fails on a variable rendered twice
    assert head["RAY_SERVE_ENABLE_HA_PROXY"]["value"] == "1"
    assert env_of(ray_containers(docs)["h200"])["RAY_SERVE_ENABLE_HA_PROXY"]["value"] == "0"


def test_serve_env_file_is_generated(tmp_path: Path) -> None:
    """files/serve-env.yaml is SERVE_ENV (the chart's copy of the one list) and `--check` notices a stale one."""
    assert helm_values.SERVE_ENV_PATH.read_text() == helm_values.render_serve_env()
    assert yaml.safe_load(helm_values.SERVE_ENV_PATH.read_text()) == SERVE_ENV
    assert "python -m docgen.helm_values" in helm_values.SERVE_ENV_PATH.read_text().splitlines()[0]
    stale = tmp_path / "serve-env.yaml"
    stale.write_text("RAY_SERVE_THROUGHPUT_OPTIMIZED: '0'\n")
    assert helm_values.main(["--check", "--serve-env", str(stale)]) == 1
    assert helm_values.main(["--check"]) == 0


@pytest.mark.parametrize("case", CASES)
def test_two_renders_are_identical(helm: str, case: str) -> None:
    """Nothing random or time-dependent in a render: GitOps (Argo CD, helm template) sees no change."""
    args = [] if CASES[case] is None else ["-f", str(CASES[case])]
    first, second = (template(helm, "--api-versions", "monitoring.coreos.com/v1", *args) for _ in range(2))
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout


# -- state, GCS fault tolerance, Ingress ----------------------------------------------------------


def test_controller_state_on_the_head(helm: str) -> None:
    docs = render(helm, "cpu")
    (claim,) = by_kind(docs)["PersistentVolumeClaim"]
    assert claim["metadata"]["name"] == f"{FULLNAME}-controller-state"
    assert claim["spec"] == {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    pods, containers = ray_pods(docs), ray_containers(docs)
    assert {"name": "controller-state", "mountPath": "/var/lib/ebplus"} in containers["head"]["volumeMounts"]
    assert {"name": "controller-state", "persistentVolumeClaim": {"claimName": claim["metadata"]["name"]}} in (
        pods["head"]["spec"]["volumes"]
    )
    assert all(m["name"] != "controller-state" for m in containers["cpu"]["volumeMounts"])  # the head only
    args = app_args(docs)
    assert args["controller"]["state_dir"] == "/var/lib/ebplus"
    assert parse_config(args).controller.placement == "head"  # the actor runs where the volume is
    # a state_dir the config sets is kept; an existing claim is used, not created
    docs = render_with(helm, "cpu", "config.controller.state_dir=/var/lib/ebplus/x", "controllerState.existingClaim=st")
    assert app_args(docs)["controller"]["state_dir"] == "/var/lib/ebplus/x"
    assert "PersistentVolumeClaim" not in by_kind(docs)
    assert {"name": "controller-state", "persistentVolumeClaim": {"claimName": "st"}} in ray_pods(docs)["head"]["spec"]["volumes"]
    assert "state_dir" not in app_args(render(helm, "default"))["controller"]


def test_gcs_fault_tolerance(helm: str) -> None:
    cluster = rayservice(render(helm, "default"))["spec"]["rayClusterConfig"]
    assert "gcsFaultToleranceOptions" not in cluster
    docs = render_with(helm, "default", "gcsFaultTolerance.enabled=true", "gcsFaultTolerance.redisAddress=redis:6379",
                       "gcsFaultTolerance.redisPassword.existingSecret=redis")  # fmt: skip
    assert rayservice(docs)["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"] == {
        "redisAddress": "redis:6379",
        "redisPassword": {"valueFrom": {"secretKeyRef": {"name": "redis", "key": "password"}}},
    }


@pytest.mark.parametrize("case", CASES)
def test_ingress_only_when_enabled(helm: str, case: str) -> None:
    docs = render(helm, case)
    values = merged_values(case)
    ingresses = by_kind(docs).get("Ingress", [])
    assert len(ingresses) == int(values.ingress.enabled)
    for ingress in ingresses:
        service = rayservice(docs)["spec"]["serveService"]
        for rule in ingress["spec"]["rules"]:
            for path in rule["http"]["paths"]:
                assert path["backend"]["service"] == {
                    "name": service["metadata"]["name"], "port": {"number": service["spec"]["ports"][0]["port"]},
                }  # fmt: skip
        assert ingress["spec"]["tls"] == [t.model_dump() for t in values.ingress.tls]
        assert "cert-manager.io/cluster-issuer" in ingress["metadata"]["annotations"]


def test_cpu_example_has_no_gpu(helm: str) -> None:
    docs = render(helm, "cpu")
    (group,) = rayservice(docs)["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    spec = group["template"]["spec"]
    assert group["groupName"] == "cpu" and group["replicas"] == 1
    assert not any("gpu" in key for part in spec["containers"][0]["resources"].values() for key in part)
    assert "nodeSelector" not in spec and "tolerations" not in spec
    config = parse_config(app_args(docs))
    assert config.replicas.accelerator == "cpu" and config.replicas.accelerator_type is None
    assert config.model.source == "builtin:tiny" and config.model.cache_dir.startswith("/home/ray/.cache/")


@pytest.mark.parametrize("case", CASES)
def test_every_ray_container_gets_the_read_deadline_hook(helm: str, case: str) -> None:
    """Ray Serve's proxy answers the API: it is started before the app, so the deadline reaches it by env
    (``ebplus.deploy.read_deadline``); unset, the hook takes the config's default."""
    from ebplus.deploy import read_deadline

    for container in ray_containers(render(helm, case)).values():
        env = env_of(container)
        assert env[read_deadline.RAY_CALLBACK_ENV]["value"] == read_deadline.RAY_CALLBACK
        assert read_deadline.ENV not in env
    for container in ray_containers(render_with(helm, case, "config.http.read_deadline_s=4")).values():
        assert env_of(container)[read_deadline.ENV]["value"] == "4"
