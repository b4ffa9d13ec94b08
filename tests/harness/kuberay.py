"""What the KubeRay operator and the kubelet do with the chart's RayService, done on this machine.

No Kubernetes here, so the test renders the chart and then does, step by step,
what a cluster would do with the rendered RayService: the operator (KubeRay
v1.7.0, whose CRD the chart is validated against) builds each Ray container's
``ray start`` line from ``rayStartParams`` and the container's resources, adds its
own environment (and ``RAY_AUTH_MODE`` / ``RAY_AUTH_TOKEN`` for ``authOptions``);
the kubelet resolves ``valueFrom`` (Secrets, the downward API) and mounts the
volumes; the operator waits for the head, PUTs ``serveConfigV2`` to the Ray
dashboard's Serve REST API with the Ray token, and polls until the application
is RUNNING. Each Ray "pod" here is a process tree started with the container's
generated command.

The rules are reproduced from KubeRay v1.7.0's ``ray-operator/controllers/ray/common/pod.go``
(``setMissingRayStartParams``, ``generateRayStartCommand``, ``convertParamMap``,
``setContainerEnvVars``, ``SetContainerTokenAuthEnvVars``) and
``utils/dashboardclient/dashboard_httpclient.go`` (the ``x-ray-authorization`` header).
What cannot be the same on one machine is substituted, and every substitution is
recorded in :attr:`LocalKubeRay.substitutions` (the test prints them): loopback
instead of pod IPs and Service names, a free port for each fixed port two pods
would share, a local directory for each volume, ``bash -c`` for ``bash -lc``.
Nothing else is changed: a wrong env var, import path, arg or port in the chart
fails the run.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from harness.waiting import HarnessError, wait_until

KUBERAY_RELEASE = "v1.7.0"
#: KubeRay's defaults (utils/constant.go): GCS port, metrics port, dashboard agent port.
HEAD_PORT, METRICS_PORT, AGENT_PORT = 6379, 8080, 52365
RAY_TOKEN_KEY = "auth_token"  # the key of the Ray token in the authOptions Secret
NAMESPACE = "llm"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def quantity(value: str | int | float) -> float:
    """A Kubernetes quantity (``"2"``, ``"500m"``, ``"8Gi"``) as a number."""
    text = str(value)
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9, "m": 1e-3}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


def start_params(
    node_type: str, params: Mapping[str, str], resources: Mapping[str, Any], fqdn: str, head_port: int
) -> dict[str, str]:
    """``rayStartParams`` completed as the operator completes them (setMissingRayStartParams,
    generateRayStartCommand: CPUs and memory from the limits, GPUs from a GPU limit)."""
    out = dict(params)
    if node_type == "worker":
        out.setdefault("address", f"{fqdn}:{head_port}")
    else:
        out.setdefault("dashboard-host", "0.0.0.0")
    out.setdefault("metrics-export-port", str(METRICS_PORT))
    out["block"] = "true"
    out.setdefault("dashboard-agent-listen-port", str(AGENT_PORT))
    limits = dict(resources.get("limits") or {})
    requests = dict(resources.get("requests") or {})
    cpu = limits.get("cpu", requests.get("cpu"))
    if "num-cpus" not in out and cpu is not None and quantity(cpu) > 0:
        out["num-cpus"] = str(int(quantity(cpu)))  # Quantity.Value(): rounded up to an integer
    if "memory" not in out and limits.get("memory") is not None:
        out["memory"] = str(int(quantity(limits["memory"])))
    gpus = [v for k, v in sorted(limits.items()) if k.endswith("/gpu")]
    if "num-gpus" not in out and gpus and quantity(gpus[0]) > 0:
        out["num-gpus"] = str(int(quantity(gpus[0])))
    return out


def command_line(node_type: str, params: Mapping[str, str]) -> str:
    """The operator's ``ray start`` line (convertParamMap: sorted flags; "true" is a bare flag, "false" dropped)."""
    special = {"log-color", "include-dashboard", "include-log-monitor"}
    flags = []
    for key in sorted(params):
        value = params[key]
        if value.lower() in ("true", "false") and key not in special:
            if value.lower() == "true":
                flags.append(f"--{key}")
        else:
            flags.append(f"--{key}={value}")
    head = "--head " if node_type == "head" else ""
    return f"ray start {head}{' '.join(flags)}"


@dataclass
class Pod:
    """One Ray pod of the rendered RayService, as the kubelet would run it here."""

    name: str
    node_type: str  # "head" | "worker"
    group: str
    container: dict[str, Any]
    volumes: list[dict[str, Any]]
    params: dict[str, str]
    root: Path  # the pod's own directory (its volumes)
    env: dict[str, str] = field(default_factory=dict)
    mounts: dict[str, Path] = field(default_factory=dict)  # mount path -> local directory
    command: str = ""
    proc: subprocess.Popen | None = None
    log: Path | None = None


class LocalKubeRay:
    """Run a rendered RayService's Ray pods on this machine and deploy its ``serveConfigV2``.

    Args:
        rayservice: the rendered RayService object.
        secrets_: the Secrets the cluster holds, ``{name: {key: value}}`` (an operator-generated
            Ray token Secret is added when ``authOptions`` names none).
        bin_dir: where ``ray`` and ``python`` are (the image's PATH).
    """

    def __init__(self, rayservice: dict[str, Any], secrets_: Mapping[str, Mapping[str, str]], bin_dir: Path) -> None:
        self.rs = rayservice
        self.name = rayservice["metadata"]["name"]
        self.cluster = f"{self.name}-{secrets.token_hex(3)[:5]}"  # the RayCluster the RayService makes
        self.secrets = {k: dict(v) for k, v in secrets_.items()}
        self.bin_dir = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="ebk-", dir="/tmp"))  # short: AF_UNIX paths stay < 107 bytes
        self.substitutions: list[str] = []
        self.ports = {"gcs": _free_port(), "dashboard": _free_port(), "client": _free_port(), "serve": _free_port()}
        self.pods: list[Pod] = []
        self._failure = ""
        spec = rayservice["spec"]["rayClusterConfig"]
        self.auth = spec.get("authOptions") or {}
        if self.auth.get("mode") == "token" and not self.auth.get("secretName"):
            # reconcileAuthSecret: the operator generates a Secret named after the RayCluster
            self.secrets[self.cluster] = {RAY_TOKEN_KEY: secrets.token_hex(32)}
        self._note(f"RayCluster name {self.cluster} (the operator appends a random suffix)")
        self._note(f"head FQDN {self.name}-head-svc.{NAMESPACE}.svc.cluster.local and pod IPs -> 127.0.0.1")

    # -- what the operator and the kubelet build ------------------------------------

    def _note(self, text: str) -> None:
        if text not in self.substitutions:
            self.substitutions.append(text)

    @property
    def token(self) -> str | None:
        if self.auth.get("mode") != "token":
            return None
        return self.secrets[self.auth.get("secretName") or self.cluster][RAY_TOKEN_KEY]

    def _pod(self, node_type: str, group: str, index: int, group_spec: dict[str, Any]) -> Pod:
        template = group_spec["template"]
        container = copy.deepcopy(template["spec"]["containers"][0])
        name = "h" if node_type == "head" else f"w{index}"
        params = {k: str(v) for k, v in (group_spec.get("rayStartParams") or {}).items()}
        params = start_params(node_type, params, container.get("resources") or {}, "127.0.0.1", self.ports["gcs"])
        pod = Pod(name, node_type, group, container, template["spec"].get("volumes") or [], params, self.root / name)
        pod.root.mkdir(parents=True, exist_ok=True)
        return pod

    def _localize(self, pod: Pod) -> None:
        """Ports and hosts two pods on one machine cannot share; every volume as a local directory."""
        p = pod.params
        p["node-ip-address"] = "127.0.0.1"
        if pod.node_type == "head":
            p["port"] = str(self.ports["gcs"])
            p["dashboard-port"] = str(self.ports["dashboard"])
            p["ray-client-server-port"] = str(self.ports["client"])
            if p.get("dashboard-host") == "0.0.0.0":
                p["dashboard-host"] = "127.0.0.1"
            self._note(f"head: --port {HEAD_PORT} -> {self.ports['gcs']}, --dashboard-port 8265 -> "
                       f"{self.ports['dashboard']}, --ray-client-server-port 10001 -> {self.ports['client']}, "
                       "--dashboard-host 0.0.0.0 -> 127.0.0.1")  # fmt: skip
        else:
            p["address"] = f"127.0.0.1:{self.ports['gcs']}"
        rendered_metrics, rendered_agent = p["metrics-export-port"], p["dashboard-agent-listen-port"]
        p["metrics-export-port"], p["dashboard-agent-listen-port"] = str(_free_port()), str(_free_port())
        self._note(f"{pod.name}: --node-ip-address 127.0.0.1, --metrics-export-port {rendered_metrics} -> "
                   f"{p['metrics-export-port']}, --dashboard-agent-listen-port {rendered_agent} -> "
                   f"{p['dashboard-agent-listen-port']} (each pod has its own IP; here they share one)")  # fmt: skip
        pod.mounts = {}
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod.volumes if "persistentVolumeClaim" in v}
        for mount in pod.container.get("volumeMounts") or []:
            path = mount["mountPath"]
            if path == "/dev/shm":
                continue  # Ray's object store: the host's /dev/shm
            if mount["name"] in claims:
                local = self.root / "pvc" / claims[mount["name"]]  # one claim, one directory, across pod restarts
            else:
                local = pod.root / path.lstrip("/")
            local.mkdir(parents=True, exist_ok=True)
            pod.mounts[path] = local
            self._note(f"{pod.name}: volume {mount['name']} at {path} -> {local}")

    def localize_path(self, pod: Pod, value: str) -> str:
        """``value`` with a mount path prefix replaced by its local directory."""
        for path, local in sorted(pod.mounts.items(), key=lambda kv: -len(kv[0])):
            if value == path or value.startswith(path.rstrip("/") + "/"):
                return str(local) + value[len(path.rstrip("/")):]
        return value

    def _env(self, pod: Pod) -> dict[str, str]:
        """The container's environment: rendered entries resolved as the kubelet does, then the operator's."""
        labels = {"ray.io/cluster": self.cluster, "ray.io/group": pod.group, "ray.io/node-type": pod.node_type}
        fields = {"metadata.namespace": NAMESPACE, "metadata.name": f"{self.cluster}-{pod.group}-{pod.name}"}
        env = kubelet_env(pod.container, self.secrets, labels, fields)

        def put(name: str, value: str) -> None:
            env.setdefault(name, value)  # the operator never overrides a variable the container has

        # SetContainerTokenAuthEnvVars
        if self.auth.get("mode") == "token":
            put("RAY_AUTH_MODE", "token")
            put("RAY_AUTH_TOKEN", self.token or "")
        # setContainerEnvVars (a RayService cluster)
        if pod.node_type == "worker":
            env["FQ_RAY_IP"] = env["RAY_IP"] = "127.0.0.1"
        env["RAY_CLUSTER_NAME"] = self.cluster
        env["RAY_CLUSTER_NAMESPACE"] = NAMESPACE
        env["RAY_CLOUD_INSTANCE_ID"] = fields["metadata.name"]
        env["RAY_NODE_TYPE_NAME"] = pod.group
        env["KUBERAY_GEN_RAY_START_CMD"] = command_line(pod.node_type, pod.params)
        put("RAY_PORT", str(self.ports["gcs"]))
        put("RAY_TIMEOUT_MS_TASK_WAIT_FOR_DEATH_INFO", "0")
        put("RAY_GCS_SERVER_REQUEST_TIMEOUT_SECONDS", "5")
        put("RAY_SERVE_KV_TIMEOUT_S", "5")
        put("RAY_ADDRESS", f"127.0.0.1:{self.ports['gcs']}")
        put("RAY_USAGE_STATS_KUBERAY_IN_USE", "1")
        put("RAY_DASHBOARD_ENABLE_K8S_DISK_USAGE", "1")
        # the image's environment; paths under the pod's volumes
        home = pod.root / "home" / "ray"
        home.mkdir(parents=True, exist_ok=True)
        env = {name: self.localize_path(pod, value) for name, value in env.items()}
        env.update(HOME=str(home), PATH=f"{self.bin_dir}{os.pathsep}/usr/bin:/bin", LANG="C.UTF-8")
        self._note(f"{pod.name}: HOME /home/ray -> {home}; PATH: this checkout's virtualenv (the image's Python)")
        # a container's /tmp is its own (a volume or its filesystem), never the host's shared one
        tmp = pod.mounts.get("/tmp") or pod.root / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        env["TMPDIR"] = env["RAY_TMPDIR"] = str(tmp)
        self._note(f"{pod.name}: /tmp -> TMPDIR/RAY_TMPDIR {tmp} (the container's own /tmp)")
        return env

    # -- lifecycle ------------------------------------------------------------------

    def _start(self, pod: Pod) -> None:
        self._localize(pod)
        pod.env = self._env(pod)
        # BuildPod: "ulimit -n ${RAY_START_ULIMIT_OPEN_FILES:-65536}; <ray start ...>" run by
        # `/bin/bash -lc --`; here `-c`: this host's /etc/profile would reset PATH
        pod.command = f"ulimit -n ${{RAY_START_ULIMIT_OPEN_FILES:-65536}}; {command_line(pod.node_type, pod.params)}"
        self._note("container command /bin/bash -lc -- -> /bin/bash -c -- (this host's /etc/profile resets PATH)")
        pod.log = self.root / f"{pod.name}.log"
        with pod.log.open("ab") as out:
            pod.proc = subprocess.Popen(["/bin/bash", "-c", "--", pod.command], env=pod.env, cwd=pod.root,
                                        stdout=out, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip

    def start_pods(self, timeout_s: float = 120) -> None:
        """The head, then (after the init container's ``ray health-check``) every worker pod."""
        spec = self.rs["spec"]["rayClusterConfig"]
        head = self._pod("head", "headgroup", 0, spec["headGroupSpec"])
        self._start(head)
        self.pods = [head]
        check = ["ray", "health-check", "--address", f"127.0.0.1:{self.ports['gcs']}"]
        self._wait("the head's GCS to answer `ray health-check`", lambda: subprocess.run(
            check, env=head.env, capture_output=True, timeout=30).returncode == 0, timeout_s)  # fmt: skip
        index = 0
        for group in spec.get("workerGroupSpecs") or []:
            for _ in range(int(group.get("replicas", 1))):
                pod = self._pod("worker", group["groupName"], index, group)
                self._start(pod)
                self.pods.append(pod)
                index += 1
        self._wait(f"{len(self.pods)} Ray nodes alive", lambda: self._nodes_alive() == len(self.pods), timeout_s)

    def _wait(self, what: str, check: Any, timeout_s: float) -> None:
        """:func:`wait_until` that gives up at once when a pod's process exits or the check finds a failure."""
        self._failure = ""
        wait_until(what, lambda: self._failure or self._dead() or check(), timeout_s, every_s=2.0)
        failure = self._failure or self._dead()
        if failure:
            raise HarnessError(failure)

    def _dead(self) -> str:
        for pod in self.pods:
            if pod.proc is not None and pod.proc.poll() is not None:
                return f"pod {pod.name} exited ({pod.proc.returncode}); its log:\n{self.tail(pod)}"
        return ""

    def _nodes_alive(self) -> int:
        try:
            nodes = self.dashboard("GET", "/nodes?view=summary").json()["data"]["summary"]
        except (httpx.HTTPError, KeyError, ValueError):
            return 0
        return sum(1 for n in nodes if n.get("raylet", {}).get("state") == "ALIVE")

    def tail(self, pod: Pod, lines: int = 40) -> str:
        return "\n".join((pod.log.read_text(errors="replace") if pod.log else "").splitlines()[-lines:])

    def dashboard(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """A call to the Ray dashboard with the operator's credentials (dashboard_httpclient.go)."""
        headers = {**kwargs.pop("headers", {}), **self._auth_header()}
        url = f"http://127.0.0.1:{self.ports['dashboard']}{path}"
        return httpx.request(method, url, headers=headers, timeout=30, **kwargs)

    def serve_config(self) -> dict[str, Any]:
        """``serveConfigV2`` as the operator submits it (YAML -> JSON), with this machine's host, port and paths."""
        config = yaml.safe_load(self.rs["spec"]["serveConfigV2"])
        http = config.setdefault("http_options", {})
        self._note(f"serveConfigV2 http_options host {http.get('host')} port {http.get('port')} -> 127.0.0.1 "
                   f"{self.ports['serve']}; the same in the app's http section")  # fmt: skip
        http.update(host="127.0.0.1", port=self.ports["serve"])
        head = self.pods[0]
        for app in config["applications"]:
            args = app.get("args") or {}
            if "http" in args:
                args["http"] = {**args["http"], "host": "127.0.0.1", "port": self.ports["serve"]}
            app["args"] = _map_strings(args, lambda s: self._writable(head, s))
        return config

    def _writable(self, pod: Pod, value: str) -> str:
        """An app arg that is an absolute path must lie on a volume: the root filesystem is read-only."""
        local = self.localize_path(pod, value)
        if value.startswith("/") and local == value and self._read_only_root(pod):
            raise HarnessError(f"serveConfigV2 args name {value}, which is on no volume of the pod: "
                               "the container's root filesystem is read-only")  # fmt: skip
        if local != value:
            self._note(f"serveConfigV2 args: {value} -> {local} (the head pod's volume; here every pod shares it)")
        return local

    @staticmethod
    def _read_only_root(pod: Pod) -> bool:
        return bool((pod.container.get("securityContext") or {}).get("readOnlyRootFilesystem"))

    def deploy(self, timeout_s: float = 600) -> float:
        """PUT ``serveConfigV2`` and poll until every application is RUNNING; the seconds it took."""
        t0 = time.monotonic()
        answer = self.dashboard("PUT", "/api/serve/applications/", content=json.dumps(self.serve_config()),
                                headers={"Content-Type": "application/json"})  # fmt: skip
        if not answer.is_success:
            raise HarnessError(f"UpdateDeployments fail: {answer.status_code} {answer.text[:500]}")
        self._wait("the Serve application to be RUNNING", self._running, timeout_s)
        return time.monotonic() - t0

    def _auth_header(self) -> dict[str, str]:
        return {"x-ray-authorization": f"Bearer {self.token}"} if self.token else {}

    def _running(self) -> bool:
        try:
            apps = self.dashboard("GET", "/api/serve/applications/?api_type=declarative").json().get("applications", {})
        except (httpx.HTTPError, ValueError):
            return False
        statuses = {name: app.get("status") for name, app in apps.items()}
        failed = {n: apps[n].get("message", "")[:3000] for n, s in statuses.items() if s == "DEPLOY_FAILED"}
        if failed:
            self._failure = f"DEPLOY_FAILED: {failed}"
        return bool(statuses) and all(s == "RUNNING" for s in statuses.values())

    def stop_pods(self) -> None:
        """Every pod's process tree killed, as the kubelet ends a deleted pod's containers: all pods at
        once (SIGTERM, then SIGKILL after the grace period), as when their node is lost."""
        import psutil

        tree: set[psutil.Process] = set()
        for pod in self.pods:
            if pod.proc is not None:
                with contextlib.suppress(psutil.Error):
                    root = psutil.Process(pod.proc.pid)
                    tree |= {root, *root.children(recursive=True), *_session(pod.proc.pid)}
        for proc in tree:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(tree, timeout=15)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        for pod in self.pods:
            if pod.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    pod.proc.wait(timeout=10)
        self.pods = []

    @contextlib.contextmanager
    def running(self) -> Iterator[LocalKubeRay]:
        """The pods started, then stopped and their directories removed (logs: :meth:`tail` before)."""
        try:
            self.start_pods()
            yield self
        finally:
            self.stop_pods()
            shutil.rmtree(self.root, ignore_errors=True)


def _session(sid: int) -> list[Any]:
    """Processes of session ``sid`` (a pod's container: one reparented by a dying parent is still in it)."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getsid(proc.pid) == sid:
                found.append(proc)
    return found


def kubelet_env(
    container: Mapping[str, Any],
    secrets_: Mapping[str, Mapping[str, str]],
    labels: Mapping[str, str] | None = None,
    fields: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A container's ``env`` as the kubelet resolves it: values, Secret keys, the downward API.

    A missing Secret or key raises, as the kubelet refuses to start such a container.
    """
    labels, fields = dict(labels or {}), {"metadata.namespace": NAMESPACE, **(fields or {})}
    env: dict[str, str] = {}
    for entry in container.get("env") or []:
        name, source = entry["name"], entry.get("valueFrom") or {}
        if "value" in entry:
            env[name] = str(entry["value"])
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            value = secrets_.get(ref["name"], {}).get(ref["key"])
            if value is None and not ref.get("optional"):
                raise HarnessError(f"env {name}: Secret {ref['name']!r} has no key {ref['key']!r} "
                                   "(the kubelet would not start the container)")  # fmt: skip
            if value is not None:
                env[name] = value
        elif "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            env[name] = labels.get(path[len("metadata.labels['") : -2], "") if path.startswith("metadata.labels") else fields[path]
        else:
            raise HarnessError(f"env {name}: unsupported valueFrom {source}")
    return env


def _map_strings(value: Any, fn: Any) -> Any:
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, dict):
        return {k: _map_strings(v, fn) for k, v in value.items()}
    if isinstance(value, list):
        return [_map_strings(v, fn) for v in value]
    return value


def helm_test_command(pod: dict[str, Any], url: str) -> list[str]:
    """The ``helm test`` pod's command, its Service URL replaced by ``url``; ``python`` is this interpreter."""
    command = list(pod["spec"]["containers"][0]["command"])
    command = [url if part.startswith("http://") else part for part in command]
    if command[0] == "python":
        command[0] = sys.executable
    return command


def render(helm: str, chart: Path, release: str, values: list[Path], sets: Mapping[str, str]) -> list[dict]:
    """``helm template`` of the chart."""
    args = [helm, "template", release, str(chart), "--namespace", NAMESPACE]
    for path in values:
        args += ["-f", str(path)]
    for key, value in sets.items():
        args += ["--set", f"{key}={value}"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise HarnessError(f"helm template failed: {proc.stderr}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


