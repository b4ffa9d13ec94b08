"""helm/ebplus with the real helm binary: lint, render, and validate every rendered object.

* ``helm lint --strict`` and ``helm template`` pass for the default values and each
  ``helm/ebplus/ci/*-values.yaml`` (the one-GPU, eight-GPU and CPU examples, mixed GPU fleet,
  existing secret, monitoring off, tensor parallelism, autoscaling, ingress), and as a subchart
  given Helm's ``global`` values;
* the Prometheus Operator objects render only where the cluster serves ``monitoring.coreos.com/v1``
  (``--api-versions``; the other tests render with it), the dashboards wherever they are enabled;
* every core object validates against the Kubernetes 1.30 OpenAPI schemas
  (kubernetes-validate, offline, strict: unknown fields fail), the RayService against
  KubeRay's CRD schema (``../shared/schemas/ray.io_rayservices.yaml``, made strict the
  same way), ServiceMonitor/PodMonitor against the Prometheus Operator CRDs (validators
  generated from them, npm ``@kubernetes-models/prometheus-operator``);
* the rendered ``serveConfigV2`` parses as Ray Serve's ``ServeDeploySchema`` and its
  app args as our ``ServeConfig`` (the one config schema);
* tokens reach the pods only through ``secretKeyRef``, from a Secret the chart creates only when asked;
* the hardening, the NetworkPolicy and the other defaults of a first install: ``test_lockdown.py``;
* bad values (``tests/helm/invalid/*.yaml``) are refused with the message their first line expects;
* ``values.schema.json`` and the chart's README (every value described) are the generated ones;
* the ``helm test`` pod runs a valid ``ebplus status`` against the release's Service.
"""

from __future__ import annotations

import copy
import functools
import json
import shutil
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from external_tools import REPO, binary, node_modules
from ray.serve.schema import ServeDeploySchema

from docgen import reference
from docgen.chart_readme import README_PATH, render_readme
from docgen.helm_values import SCHEMA_PATH, ChartValues, render_schema
from ebplus.deploy.config import load_config, parse_config

CHART = REPO / "helm" / "ebplus"
CRD = REPO.parent / "shared" / "schemas" / "ray.io_rayservices.yaml"
KUBE_VERSION = "1.30.0"
MONITORING_API = "monitoring.coreos.com/v1"
NAMESPACE = "llm"
RELEASE = "eb"

CASES = {
    "default": None,
    "mixed-fleet": CHART / "ci" / "mixed-fleet-values.yaml",
    "existing-secret": CHART / "ci" / "existing-secret-values.yaml",
    "monitoring-off": CHART / "ci" / "monitoring-off-values.yaml",
    "tensor-parallel": CHART / "ci" / "tensor-parallel-values.yaml",
    "autoscaling": CHART / "ci" / "autoscaling-values.yaml",
    "cpu": CHART / "ci" / "cpu-values.yaml",
    "one-gpu": CHART / "ci" / "one-gpu-values.yaml",
    "eight-gpu": CHART / "ci" / "eight-gpu-values.yaml",
    "ingress": CHART / "ci" / "ingress-values.yaml",
}
INVALID = sorted((Path(__file__).parent / "invalid").glob("*.yaml"))


@pytest.fixture(scope="module")
def helm() -> str:
    return binary("helm", "HELM")


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=60)


def values_args(case: str) -> list[str]:
    path = CASES[case]
    return [] if path is None else ["-f", str(path)]


@functools.cache
def render(helm: str, case: str, monitoring_api: bool = True) -> list[dict]:
    """``helm template`` of a case, on a cluster with (default) or without the Prometheus Operator's API."""
    api = ["--api-versions", MONITORING_API] if monitoring_api else []
    proc = run_helm(
        helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION,
        *api, *values_args(case),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def _merge(base: dict, over: dict) -> dict:
    """Helm's merge of a values file over the defaults: maps merge, null deletes, the rest replaces."""
    out = dict(base)
    for key, value in over.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def merged_values(case: str) -> ChartValues:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    if CASES[case] is not None:
        values = _merge(values, yaml.safe_load(CASES[case].read_text()))
    return ChartValues.model_validate(values)


def by_kind(docs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for doc in docs:
        out.setdefault(doc["kind"], []).append(doc)
    return out


# -- schema of values ---------------------------------------------------------------


def test_values_schema_is_generated() -> None:
    assert SCHEMA_PATH.read_text() == render_schema(), "stale: run `python -m docgen.helm_values`"


def test_chart_readme_is_generated_and_documents_every_value() -> None:
    """helm/ebplus/README.md is current (`python -m docgen.reference`), every value has a description."""
    assert README_PATH.read_text() == render_readme(), "stale: run `python -m docgen.reference`"
    rows = reference.helm_values_rows()
    assert {r[0] for r in rows} >= {"`global`", "`helmTest.enabled`", "`monitoring.prometheusRule.enabled`"}
    undocumented = [r[0] for r in rows if not r[-1].strip()]
    assert not undocumented, f"chart values without a description in docgen/helm_values.py: {undocumented}"


def test_default_config_is_the_gpu_example() -> None:
    """The chart's default `config` is deploy/gpu.yaml, key for key (so the two cannot drift)."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["config"] == yaml.safe_load((REPO / "deploy" / "gpu.yaml").read_text())
    ChartValues.model_validate(values)
    load_config(REPO / "deploy" / "gpu.yaml")


# -- lint and render ----------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_lint(helm: str, case: str) -> None:
    proc = run_helm(helm, "lint", "--strict", str(CHART), "--namespace", NAMESPACE, *values_args(case))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


@pytest.mark.parametrize("case", CASES)
def test_monitoring_only_where_the_operator_api_is(helm: str, case: str) -> None:
    """Without monitoring.coreos.com/v1 (no Operator CRDs) the release renders, minus the Operator's objects.

    The dashboards ConfigMap is not one of them: Grafana's sidecar reads it without the Operator."""
    bare = by_kind(render(helm, case, monitoring_api=False))
    assert not MONITORING_KINDS & set(bare)
    assert all("head-metrics" not in s["metadata"]["name"] for s in bare.get("Service", []))
    full = by_kind(render(helm, case))
    values = merged_values(case)
    expected = {"ServiceMonitor", "PodMonitor", "PrometheusRule"} if values.monitoring.enabled else set()
    assert MONITORING_KINDS & set(full) == expected
    for kinds in (bare, full):
        dashboards = [c for c in kinds.get("ConfigMap", []) if c["metadata"]["name"].endswith("-dashboards")]
        assert len(dashboards) == int(values.dashboards.enabled)

    def rest(kinds: dict[str, list[dict]]) -> set[tuple[str, str]]:
        """Everything but the monitoring objects (the head-metrics Service exists for the ServiceMonitor)."""
        return {(k, d["metadata"]["name"]) for k, docs in kinds.items() if k not in MONITORING_KINDS for d in docs
                if not d["metadata"]["name"].endswith("-head-metrics")}  # fmt: skip

    assert rest(full) == rest(bare)


def test_as_a_subchart_with_global_values(helm: str, tmp_path: Path) -> None:
    """A parent chart that depends on this one passes its `global` values down: the schema accepts them."""
    parent = tmp_path / "platform"
    shutil.copytree(CHART, parent / "charts" / "ebplus")
    (parent / "Chart.yaml").write_text(
        "apiVersion: v2\nname: platform\nversion: 1.0.0\n"
        "dependencies:\n  - name: ebplus\n    version: 0.1.0\n"
    )
    (parent / "values.yaml").write_text(
        "global:\n  imageRegistry: registry.example.com\n  storageClass: fast\n"
        "ebplus:\n  image:\n    repository: registry.example.com/ebplus-serve\n"
    )
    proc = run_helm(helm, "lint", "--strict", str(parent), "--namespace", NAMESPACE)
    assert proc.returncode == 0 and "0 chart(s) failed" in proc.stdout, proc.stdout + proc.stderr
    for api in ([], ["--api-versions", MONITORING_API]):
        proc = run_helm(helm, "template", "eb", str(parent), "--namespace", NAMESPACE, *api)
        assert proc.returncode == 0, proc.stderr
        docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
        (rs,) = by_kind(docs)["RayService"]
        image = rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]
        assert image == "registry.example.com/ebplus-serve:0.1.0"
        assert ("PrometheusRule" in by_kind(docs)) == bool(api)


def _strict(schema: object) -> object:
    """A CRD schema that refuses unknown fields, as `kubectl apply --validate=strict` does."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@functools.cache
def rayservice_validator() -> jsonschema.Draft7Validator:
    crd = yaml.safe_load(CRD.read_text())
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return jsonschema.Draft7Validator(_strict(copy.deepcopy(v1["schema"]["openAPIV3Schema"])))


def validate_monitors(objects: list[dict]) -> list[str | None]:
    modules = node_modules()
    proc = subprocess.run(
        ["node", str(Path(__file__).parent / "validate_monitors.mjs"), str(modules)],
        input=json.dumps(objects), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("case", CASES)
def test_every_object_validates(helm: str, case: str) -> None:
    docs = render(helm, case)
    monitors = []
    for doc in docs:
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["apiVersion"] == "ray.io/v1":
            errors = sorted(rayservice_validator().iter_errors(doc), key=lambda e: list(e.path))
            assert not errors, where + ": " + "; ".join(f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors)
        elif doc["apiVersion"].startswith("monitoring.coreos.com/"):
            monitors.append(doc)
        else:
            try:
                kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
            except kubernetes_validate.ValidationError as e:
                pytest.fail(f"{where}: {'.'.join(map(str, e.path))}: {e.message}")
    if monitors:
        results = validate_monitors(monitors)
        bad = [f"{m['kind']}/{m['metadata']['name']}: {r}" for m, r in zip(monitors, results, strict=True) if r]
        assert not bad, bad


def test_validators_reject_bad_objects(helm: str) -> None:
    """The validators used above do catch mistakes (so their passing means something)."""
    kinds = by_kind(render(helm, "default"))
    rs = copy.deepcopy(kinds["RayService"][0])
    rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["replica"] = 1  # typo of replicas
    assert list(rayservice_validator().iter_errors(rs))
    for path, value in ((("ports", 0, "port"), "eight thousand"), (("selectr",), {})):
        svc = copy.deepcopy(kinds["Service"][0])
        node = svc["spec"]
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(svc, KUBE_VERSION, strict=True)
    sm = copy.deepcopy(kinds["ServiceMonitor"][0])
    sm["spec"]["endpoints"][0]["interval"] = 15
    rule = copy.deepcopy(kinds["PrometheusRule"][0])
    rule["spec"]["groups"][0]["rules"][0]["for"] = "five minutes"
    assert all(validate_monitors([sm, rule]))


@pytest.mark.parametrize("case", CASES)
def test_serve_config_is_ray_serve_schema_and_our_config(helm: str, case: str) -> None:
    (rs,) = by_kind(render(helm, case))["RayService"]
    serve = yaml.safe_load(rs["spec"]["serveConfigV2"])
    ServeDeploySchema.model_validate(serve)
    (app,) = serve["applications"]
    assert app["import_path"] == "ebplus.deploy.app:build_app" and app["route_prefix"] == "/"
    config = parse_config(app["args"], f"{case}: serveConfigV2 args")
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    if CASES[case] is None:
        assert app["args"] == values["config"]  # verbatim: the values' config block is the app's args
    assert serve["http_options"]["port"] == config.http.port
    params = rs["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"]
    assert params["metrics-export-port"] == str(config.ray.metrics_export_port)
    assert params["num-gpus"] == "0"


def _containers(rs: dict) -> list[dict]:
    cluster = rs["spec"]["rayClusterConfig"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    return [c for g in groups for c in g["template"]["spec"]["containers"]]


@pytest.mark.parametrize("case", CASES)
def test_credentials_only_from_secret(helm: str, case: str) -> None:
    kinds = by_kind(render(helm, case))
    (rs,) = kinds["RayService"]
    config = parse_config(yaml.safe_load(rs["spec"]["serveConfigV2"])["applications"][0]["args"])
    values = merged_values(case)
    secret_name = values.auth.existingSecret or f"{RELEASE}-ebplus-auth"
    assert not values.auth.generate, "a case that generates its Secret would render differently every time"
    expected = {config.auth.admin_token_env: values.auth.adminTokenKey}
    if values.auth.apiKey.enabled:
        expected[config.auth.api_key_env] = values.auth.apiKey.key
    test_pods = [c for pod in kinds.get("Pod", []) for c in pod["spec"]["containers"]]
    for container in _containers(rs) + test_pods:
        env = {e["name"]: e for e in container["env"]}
        for name, key in expected.items():
            assert "value" not in env[name], f"{name} rendered in clear"
            assert env[name]["valueFrom"]["secretKeyRef"] == {"name": secret_name, "key": key}
        if not values.auth.apiKey.enabled:
            assert config.auth.api_key_env not in env
    # the documented path: the admin Secret exists before the install, the chart never writes it
    assert [s for s in kinds.get("Secret", []) if s["metadata"]["name"] == secret_name] == []
    assert all(s["metadata"]["name"] == f"{RELEASE}-ebplus-hf" for s in kinds.get("Secret", []))


def test_generated_admin_secret_is_kept(helm: str) -> None:
    """auth.generate: the chart creates the Secret auth.existingSecret names, random, kept at uninstall."""
    proc = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--set", "auth.generate=true",
                    "--set", "auth.apiKey.enabled=true", "--show-only", "templates/secret.yaml")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    secret = yaml.safe_load(proc.stdout)
    assert secret["metadata"]["name"] == "ebplus-auth"
    assert secret["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert set(secret["data"]) == {"admin-token", "api-key"} and all(len(v) >= 40 for v in secret["data"].values())


@pytest.mark.parametrize("case", CASES)
def test_helm_test_pod_runs_ebplus_status(helm: str, case: str) -> None:
    """`helm test` runs `ebplus status` (a valid command line) against this release's Serve Service."""
    from ebplus.cli import build_parser

    kinds = by_kind(render(helm, case))
    (pod,) = kinds["Pod"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test" and pod["spec"]["restartPolicy"] == "Never"
    (container,) = pod["spec"]["containers"]
    command = container["command"]
    assert command[:4] == ["python", "-m", "ebplus.cli", "status"]
    args = build_parser("status").parse_args(command[3:])
    (rs,) = kinds["RayService"]
    config = parse_config(yaml.safe_load(rs["spec"]["serveConfigV2"])["applications"][0]["args"])
    service = rs["spec"]["serveService"]
    assert args.url == f"http://{service['metadata']['name']}.{NAMESPACE}.svc:{service['spec']['ports'][0]['port']}"
    assert args.expect_model == config.model.id
    env = {e["name"] for e in container["env"]}
    assert args.token_env == config.auth.admin_token_env and args.token_env in env
    assert args.api_key_env == config.auth.api_key_env
    assert (args.api_key_env in env) == merged_values(case).auth.apiKey.enabled
    assert container["image"] == _containers(rs)[0]["image"]


def test_mixed_fleet_groups(helm: str) -> None:
    (rs,) = by_kind(render(helm, "mixed-fleet"))["RayService"]
    groups = {g["groupName"]: g for g in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]}
    assert set(groups) == {"h200", "l40s"}
    for name, count, nodes, product in (("h200", 8, 1, "NVIDIA-H200"), ("l40s", 2, 2, "NVIDIA-L40S")):
        g = groups[name]
        assert g["replicas"] == g["minReplicas"] == g["maxReplicas"] == nodes
        spec = g["template"]["spec"]
        (container,) = spec["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == count
        assert spec["nodeSelector"] == {"nvidia.com/gpu.product": product}
        assert {"name": "models", "mountPath": "/models", "readOnly": True} in container["volumeMounts"]
        assert spec["tolerations"][0]["key"] == "nvidia.com/gpu"
    head = rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert not any("gpu" in k for k in head["resources"].get("limits", {}))
    args = yaml.safe_load(rs["spec"]["serveConfigV2"])["applications"][0]["args"]
    assert args["replicas"]["num_replicas"] == 12 and "accelerator_type" not in args["replicas"]


def test_tensor_parallel_replicas_get_their_gpus(helm: str) -> None:
    """Each replica's GPUs (Ray Serve LLM's placement group) fit inside one worker pod, and the pods hold them all."""
    from ebplus.deploy.app import llm_config

    (rs,) = by_kind(render(helm, "tensor-parallel"))["RayService"]
    config = parse_config(yaml.safe_load(rs["spec"]["serveConfigV2"])["applications"][0]["args"])
    tp = config.engine.extra["tensor_parallel_size"]
    # what Ray Serve LLM reserves per replica, from the same engine kwargs (read in its code: a
    # placement group of tensor_parallel_size x pipeline_parallel_size {"GPU": 1} bundles)
    bundles = llm_config(config, config.model.source).get_engine_config().placement_bundles
    assert tp == 2 and [b["GPU"] for b in bundles] == [1] * tp
    slots = 0
    for group in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        (container,) = group["template"]["spec"]["containers"]
        gpus = container["resources"]["limits"]["nvidia.com/gpu"]
        assert gpus == container["resources"]["requests"]["nvidia.com/gpu"] and gpus % tp == 0
        slots += group["replicas"] * gpus // tp
    assert slots == config.replicas.num_replicas == 8


def test_autoscaling_reaches_kuberay_and_serve(helm: str) -> None:
    """In-tree autoscaling on the RayService, the group's bounds on its pods, Serve's on the replicas."""
    (default,) = by_kind(render(helm, "default"))["RayService"]
    assert default["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] is False
    (rs,) = by_kind(render(helm, "autoscaling"))["RayService"]
    cluster = rs["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is True
    (group,) = cluster["workerGroupSpecs"]
    assert (group["minReplicas"], group["maxReplicas"]) == (1, 4)
    replicas = yaml.safe_load(rs["spec"]["serveConfigV2"])["applications"][0]["args"]["replicas"]
    assert "num_replicas" not in replicas and replicas["autoscaling"]["max_replicas"] == 32


def test_monitoring_and_dashboards(helm: str) -> None:
    kinds = by_kind(render(helm, "default"))
    (sm,) = kinds["ServiceMonitor"]
    (pm,) = kinds["PodMonitor"]
    services = {s["metadata"]["name"]: s for s in kinds["Service"]}
    head_metrics = services[f"{RELEASE}-ebplus-head-metrics"]
    # the ServiceMonitor selects that Service, which selects the head pod, whose container names the port
    assert sm["spec"]["selector"]["matchLabels"].items() <= head_metrics["metadata"]["labels"].items()
    (rs,) = kinds["RayService"]
    head_pod = rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]
    assert head_metrics["spec"]["selector"].items() <= head_pod["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == "serve" and sm["spec"]["endpoints"][0]["path"] == "/metrics"
    # the PodMonitor selects every Ray pod and scrapes the port named metrics
    for container, pod in [(c, g["template"]) for g in [rs["spec"]["rayClusterConfig"]["headGroupSpec"],
                                                         *rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]]
                           for c in g["template"]["spec"]["containers"]]:  # fmt: skip
        assert pm["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        assert {"name": "metrics", "containerPort": 8080, "protocol": "TCP"} in container["ports"]
    (cm,) = kinds["ConfigMap"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = {p.name: json.loads(p.read_text()) for p in (REPO / "dashboards").glob("*.json")}
    assert {k: json.loads(v) for k, v in cm["data"].items()} == shipped and len(shipped) == 2

    off = by_kind(render(helm, "monitoring-off"))
    assert not {"ServiceMonitor", "PodMonitor", "ConfigMap"} & set(off)
    assert all("head-metrics" not in s["metadata"]["name"] for s in off.get("Service", []))
    (rs_off,) = off["RayService"]
    for container in _containers(rs_off):
        assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in container["ports"]


@pytest.mark.parametrize("case", ["default", "existing-secret"])
def test_notes_show_urls_and_curl(helm: str, case: str, tmp_path: Path) -> None:
    """NOTES.txt, rendered by helm itself (a chart copy wraps it in a ConfigMap: no cluster needed)."""
    chart = tmp_path / "ebplus"
    shutil.copytree(CHART, chart)
    notes = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "NOTES.txt").unlink()
    (chart / "templates" / "_notes.tpl").write_text('{{- define "test.notes" }}' + notes + "{{- end }}")
    (chart / "templates" / "notes.yaml").write_text(
        'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\ndata:\n  notes: |\n{{- include "test.notes" . | nindent 4 }}\n'
    )
    proc = run_helm(
        helm, "template", RELEASE, str(chart), "--namespace", NAMESPACE, "--show-only", "templates/notes.yaml",
        *values_args(case),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    text = yaml.safe_load(proc.stdout)["data"]["notes"]
    assert f"kubectl -n {NAMESPACE} port-forward svc/{RELEASE}-ebplus-serve 8000:8000" in text
    assert f"http://{RELEASE}-ebplus-serve.{NAMESPACE}.svc:8000/v1" in text
    assert "curl -s http://127.0.0.1:8000/v1/chat/completions" in text
    assert 'curl -s -H "Authorization: Bearer $TOKEN" http://127.0.0.1:8000/admin/thresholds' in text
    secret = "ebplus-credentials" if case == "existing-secret" else "ebplus-auth"
    assert f"get secret {secret}" in text
    assert f"kubectl -n {NAMESPACE} create secret generic {secret}" in text  # the Secret to create first
    if case == "existing-secret":
        assert text.index("API_KEY=$(") < text.index("Authorization: Bearer $API_KEY")


# -- rejected values ----------------------------------------------------------------


@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_invalid_values_are_rejected_readably(helm: str, path: Path) -> None:
    expect = path.read_text().splitlines()[0].removeprefix("# expect:").strip()
    proc = run_helm(helm, "template", RELEASE, str(CHART), "-f", str(path))
    assert proc.returncode != 0, f"helm template accepted {path.name}"
    assert expect in proc.stderr, proc.stderr
    # helm lint reports the same line (schema errors fail it; it downgrades a template's fail() to INFO)
    proc = run_helm(helm, "lint", "--strict", str(CHART), "-f", str(path))
    assert expect in proc.stdout + proc.stderr, proc.stdout + proc.stderr
