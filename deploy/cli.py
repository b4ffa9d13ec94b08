"""``ebplus serve``, ``deploy``, ``shutdown`` and ``build-model``: the operations on a Ray cluster.

They take Ray's habits: ``--address`` names the cluster (else the config's ``ray.address``,
else ``RAY_ADDRESS``: the order ``ray.init`` reads them in), ``--config`` defaults to the
packaged ``deploy/local.yaml`` from any directory, and every flag that overrides a config
field is validated as the file is (:func:`ebplus.deploy.config.with_overrides`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ebplus.arguments import renamed_flag
from ebplus.deploy.config import DEFAULT_CONFIG, ConfigError, RaySection, ServeConfig, load_config, with_overrides
from ebplus.errors import CommandError

#: Default limit for the application to reach RUNNING (``--deploy-timeout``): a first start
#: may download a model from the Hub and compile CUDA graphs; on a CPU it takes a minute or two.
DEPLOY_TIMEOUT_S = 1200.0

#: The environment variable Ray's own CLI and ``ray.init`` read for the cluster's address.
RAY_ADDRESS_ENV = "RAY_ADDRESS"


def _add_deploy_timeout(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--deploy-timeout",
        type=float,
        default=DEPLOY_TIMEOUT_S,
        metavar="SECONDS",
        help=f"give up (exit 2, naming the logs and the last error) if the application is not running after "
        f"this long; 0 waits forever (default {DEPLOY_TIMEOUT_S:.0f})",
    )


def _add_address(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--address",
        default=None,
        metavar="HOST:PORT",
        help=f"the Ray cluster (its GCS, as `ray start --head` prints it, or 'auto'); {what}",
    )
    renamed_flag(parser, "--ray-address", "--address")


def _add_config(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help=f"{what} (YAML; keys: docs/reference/config.md); default: the packaged deploy/local.yaml (one CPU "
        "replica of the embedded SmolLM2), from any directory",
    )


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser(
        "serve",
        help="run the application from a config file in the foreground (Ray's `serve run`)",
        description=(
            "Start (or join) a Ray cluster, the EB+ controller actor and the Serve application "
            "(OpenAI API, /admin, /metrics) described by a config file, then wait until Ctrl-C or "
            "SIGTERM and shut down cleanly: on a cluster it started, Ray Serve and Ray; on a cluster it "
            "joined, only its application. Builtin models are built first if missing (into model.cache_dir, "
            "relative to the working directory). --port, --host and --address override the config's fields "
            "and are validated as the file is (exit 2 naming the flag and the field)."
        ),
        epilog="Examples: ebplus serve --check; ebplus serve --config deploy/gpu.yaml --port 8001; "
        "RAY_ADDRESS=10.0.0.5:6379 ebplus serve --config my.yaml",
    )
    _add_config(s, "deployment config")
    s.add_argument(
        "--port", type=int, default=None, help="override http.port, the port of the OpenAI API, /admin and /metrics"
    )
    s.add_argument("--host", default=None, help="override http.host, the address the HTTP proxy binds")
    s.add_argument(
        "--check",
        action="store_true",
        help="validate the config and exit: the schema, then offline checks of model.source, the engine "
        "arguments against vLLM's and the devices (serving runs the same checks before starting Ray)",
    )
    _add_address(s, f"overrides ray.address; default ray.address, else ${RAY_ADDRESS_ENV}, else start a local cluster")
    _add_deploy_timeout(s)
    s.set_defaults(run=run_serve)

    d = sub.add_parser(
        "deploy",
        help="deploy or update the application on a running Ray cluster, then return (`serve deploy`)",
        description=(
            "Deploy the Serve application of a config file to the running Ray cluster at --address and "
            "return (ebplus serve stays in the foreground instead). On an application that already runs "
            "(started by ebplus serve or an earlier deploy) this is an in-place update: Serve replaces the "
            "model replicas one at a time when their settings changed (each old replica finishes its requests "
            "first), and the EB+ controller is upgraded when its code or controller: settings changed, resuming "
            "from its persisted state. Returns once the application runs the new config."
        ),
        epilog="Example: ebplus deploy --config deploy/gpu.yaml --address 10.0.0.5:6379",
    )
    d.add_argument("--config", type=Path, required=True, metavar="FILE", help="deployment config (YAML)")
    _add_address(d, f"overrides ray.address; default ray.address, else ${RAY_ADDRESS_ENV} (one is required)")
    d.add_argument(
        "--delete",
        action="store_true",
        help="remove the application instead and leave the controller (ebplus shutdown removes both)",
    )
    _add_deploy_timeout(d)
    d.set_defaults(run=run_deploy, host=None, port=None)

    h = sub.add_parser(
        "shutdown",
        help="remove the EB+ application and controller from a Ray cluster (`serve shutdown`)",
        description=(
            "Delete the EB+ Serve application ('ebplus') and stop the EB+ controller actor on the Ray "
            "cluster at --address, after it persisted its state (the next ebplus serve or deploy on that "
            "cluster resumes from it). Ray, Ray Serve and any other application on the cluster stay; "
            "Ray's `serve shutdown` removes those. Nothing to remove is not an error."
        ),
        epilog="Example: ebplus shutdown --address 10.0.0.5:6379 --yes",
    )
    _add_address(h, f"default ${RAY_ADDRESS_ENV} (one is required)")
    h.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation (needed without a terminal)")
    h.set_defaults(run=run_shutdown)

    b = sub.add_parser(
        "build-model",
        help="build a bundled model directory (SmolLM2 or the tiny test model)",
        description="Build (idempotently) a builtin model directory and print its path.",
    )
    b.add_argument("name", choices=("smollm2", "tiny"), help="which builtin model")
    b.add_argument("--cache-dir", type=Path, default=Path("models"), help="where models are cached")
    b.set_defaults(run=run_build_model)


@contextlib.contextmanager
def building(what: str) -> Iterator[None]:
    """Turn a model build's expected failures (download, checksum, conversion) into one-line errors."""
    try:
        yield
    except subprocess.CalledProcessError as exc:
        command = " ".join(map(str, exc.cmd[:4]))
        raise CommandError(f"{what}: `{command} ...` failed with exit code {exc.returncode}") from None
    except RuntimeError as exc:
        raise CommandError(f"{what}: {exc}") from None


def run_build_model(args: argparse.Namespace) -> int:
    from ebplus.deploy import models

    builder = {"smollm2": models.build_smollm2, "tiny": models.build_tiny_llama}[args.name]
    with building(f"building model {args.name}"):
        path = builder(args.cache_dir.expanduser().resolve(), log=lambda msg: print(f"[build-model] {msg}", flush=True))
    print(path)
    return 0


def cluster_address(args: argparse.Namespace, configured: str | None = None) -> tuple[str, str] | None:
    """The Ray cluster to override ``configured`` (the config's ``ray.address``) with, and where it came
    from: ``--address``, else, when the config names none, ``RAY_ADDRESS``. The order is ``ray.init``'s
    (an explicit address, else the environment); ``None``: keep ``configured``."""
    if args.address is not None:
        return "--address", args.address
    if configured:
        return None
    env = os.environ.get(RAY_ADDRESS_ENV, "").strip()
    return (RAY_ADDRESS_ENV, env) if env else None


def _with_overrides(cfg: ServeConfig, args: argparse.Namespace) -> ServeConfig:
    overrides: dict[str, tuple[str, Any]] = {
        f"http.{name}": (f"--{name}", value) for name in ("host", "port") if (value := getattr(args, name)) is not None
    }
    if (address := cluster_address(args, cfg.ray.address)) is not None:
        overrides["ray.address"] = address
    return with_overrides(cfg, overrides)


def _replicas(cfg: ServeConfig) -> str:
    auto = cfg.replicas.autoscaling
    return f"{cfg.replicas.num_replicas} replica(s)" if auto is None else f"{auto.min_replicas}-{auto.max_replicas} replicas (autoscaling)"


def banner(cfg: ServeConfig, ray_address: str | None = None) -> str:
    host = "127.0.0.1" if cfg.http.host in ("0.0.0.0", "::") else cfg.http.host
    models = ", ".join(f"model {m.model.id!r}, {_replicas(m)}, mode {m.scheduler.mode.value}" for m in cfg.models())
    base = f"http://{host}:{cfg.http.port}"
    # NOTE: the exact GCS address, so a driver (tests, an operator's shell) attaches to
    # this cluster rather than to whichever Ray started last on the machine ("auto").
    cluster = [] if ray_address is None else [f"  Ray cluster  {ray_address}   (ray.init(address=...), namespace {cfg.ray.namespace!r})"]
    return "\n".join(
        [
            f"EB+ Serve is up: {models}",
            f"  OpenAI API   {base}/v1",
            f"  admin        {base}/admin/thresholds   (mutations need Authorization: Bearer ${cfg.auth.admin_token_env})",
            f"  metrics      {base}/metrics",
            f"  Ray metrics  http://{host}:{cfg.ray.metrics_export_port}/metrics",
            *cluster,
            "  try:",
            f"    curl -s {base}/v1/chat/completions -H 'Content-Type: application/json' \\",
            f"      -d '{{\"model\": \"{cfg.model.id}\", \"messages\": [{{\"role\": \"user\", \"content\": \"What is the capital of France?\"}}], \"max_tokens\": 32}}'",
            "Ctrl-C stops it.",
        ]
    )


#: How Ray says a start missed one of its own startup waits (lower case): a raylet that did not register with the
#: GCS within 30 s ("... timed out during startup"), or a GCS that did not publish its port within 30 s ("Timed out
#: waiting for file .../gcs_server_port_..."). A loaded 2-core machine can miss either; the next try usually starts.
RAY_START_TIMEOUTS = ("timed out during startup", "timed out waiting for file")


def ray_start_timed_out(error: object) -> bool:
    """Whether ``error`` (an exception, or its text) is Ray missing one of its startup waits."""
    text = str(error).lower()
    return any(marker in text for marker in RAY_START_TIMEOUTS)


def start_ray(section: RaySection, attempts: int = 3) -> Path:
    """Join ``section.address`` or start a local Ray and return the session directory (logs);
    retried when Ray misses one of its startup waits (:data:`RAY_START_TIMEOUTS`)."""
    import ray

    from ebplus.deploy.progress import DEFAULT_SESSION_DIR

    for attempt in range(1, attempts + 1):
        try:
            if section.address:
                context = ray.init(address=section.address, namespace=section.namespace, log_to_driver=False)
            else:
                context = ray.init(
                    num_cpus=section.num_cpus,
                    namespace=section.namespace,
                    include_dashboard=False,
                    log_to_driver=False,
                    _metrics_export_port=section.metrics_export_port,
                )
            return Path(context.address_info.get("session_dir") or DEFAULT_SESSION_DIR)
        except Exception as exc:  # Ray raises a bare Exception (a raylet) or a RuntimeError (the GCS)
            if not ray_start_timed_out(exc):
                raise
            if attempt == attempts:
                raise CommandError(
                    f"Ray did not start in {attempts} attempts ({exc}); a loaded machine? Ray's logs: "
                    f"{DEFAULT_SESSION_DIR / 'logs'}"
                ) from None
            print(f"[serve] Ray start timed out ({exc}); retrying ({attempt}/{attempts - 1})", flush=True)
            ray.shutdown()
    raise AssertionError("unreachable")


def say(message: str) -> None:
    print(f"[serve] {message}", flush=True)


def deploy_app(
    cfg: ServeConfig,
    model_sources: dict[str, str],
    session_dir: Path,
    timeout_s: float,
    tag: str,
    cancelled: Callable[[], bool],
) -> float:
    """Deploy the application (a new one, or an in-place update of the running one) and wait until it
    runs; returns the seconds it took (an expected failure is a :class:`CommandError` naming the logs)."""
    from ray import serve

    from ebplus.deploy.app import APP_NAME, build
    from ebplus.deploy.progress import DeployError, wait_until_running

    def log(message: str) -> None:
        print(f"[{tag}] {message}", flush=True)

    serve.start(proxy_location=cfg.http.proxy_location, http_options={"host": cfg.http.host, "port": cfg.http.port})
    limit = f"limit {timeout_s:.0f} s, --deploy-timeout" if timeout_s else "no time limit"
    replicas = ", ".join(f"{_replicas(m)} of {m.model.id!r}" for m in cfg.models())
    log(
        f"deploying {replicas}: the engine start takes a minute "
        f"or more on CPU, longer for a large model ({limit})"
    )
    app = serve.RunTarget(build(cfg, model_sources=model_sources), name=APP_NAME, route_prefix="/")
    serve.run_many([app], wait_for_ingress_deployment_creation=False, wait_for_applications_running=False)
    try:
        return wait_until_running(serve.status, APP_NAME, timeout_s, session_dir, log, cancelled=cancelled)
    except DeployError as exc:
        for line in exc.details:
            print(f"[{tag}] {line}", file=sys.stderr, flush=True)
        raise CommandError(exc.summary) from None


def _load(args: argparse.Namespace, command: str) -> ServeConfig | None:
    """The config with the command line's overrides, or None once the reason it is invalid is printed
    (exit status 2: the user's input, not a failure of the run); checked before anything starts."""
    if args.config is None:
        args.config = DEFAULT_CONFIG
    try:
        cfg = _with_overrides(load_config(args.config), args)
    except ConfigError as exc:
        print(f"ebplus {command}: {exc}", file=sys.stderr)
        return None
    if args.deploy_timeout < 0:
        raise CommandError(f"--deploy-timeout must be >= 0 seconds, got {args.deploy_timeout:g}")
    return cfg


def run_deploy(args: argparse.Namespace) -> int:
    cfg = _load(args, "deploy")
    if cfg is None:
        return 2
    if not cfg.ray.address:
        print(
            f"ebplus deploy: {args.config}: ray.address: deploy needs a running Ray cluster "
            f"(--address, {RAY_ADDRESS_ENV} or ray.address; ebplus serve starts a local one)",
            file=sys.stderr,
        )
        return 2

    import ray
    from ray import serve

    from ebplus.deploy.app import APP_NAME, model_paths

    source = None if args.delete else model_paths(cfg, build=True)
    session_dir = start_ray(cfg.ray)
    try:
        if args.delete:
            serve.delete(APP_NAME)
            print(f"[deploy] application {APP_NAME!r} removed", flush=True)
        else:
            assert source is not None
            took = deploy_app(cfg, source, session_dir, args.deploy_timeout, "deploy", lambda: False)
            print(f"[deploy] running the new config after {took:.0f} s", flush=True)
    finally:
        ray.shutdown()
    return 0


def _confirm(question: str) -> bool:
    """Ask on the terminal; without one (a script, CI) the caller must have passed ``--yes``."""
    if not sys.stdin.isatty():
        raise CommandError(f"{question} needs confirmation: pass --yes (stdin is not a terminal)")
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def run_shutdown(args: argparse.Namespace) -> int:
    address = cluster_address(args)
    if address is None:
        raise CommandError(
            f"which Ray cluster? pass --address HOST:PORT or set {RAY_ADDRESS_ENV} (ebplus serve prints the address)"
        )
    from ebplus.deploy.app import APP_NAME

    where = f"the Ray cluster at {address[1]}"
    if not args.yes and not _confirm(f"Remove the application {APP_NAME!r} and the EB+ controller from {where}?"):
        print("[shutdown] nothing changed", flush=True)
        return 1

    import ray
    from ray import serve

    from ebplus.controller.actor import ACTOR_NAME, get_controller
    from ebplus.controller.lifecycle import stop_controller

    def log(message: str) -> None:
        print(f"[shutdown] {message}", flush=True)

    start_ray(RaySection(address=address[1]))
    try:
        if APP_NAME in serve.status().applications:
            serve.delete(APP_NAME)
            log(f"application {APP_NAME!r} deleted from {where}")
        else:
            log(f"no application {APP_NAME!r} on {where}")
        handle = get_controller()
        if handle is None:
            log(f"no controller {ACTOR_NAME!r} on {where}")
        else:
            version = stop_controller(handle)
            kept = "its last periodic snapshot" if version is None else f"its state at version {version}"
            log(f"controller {ACTOR_NAME!r} stopped; {kept} stays persisted for the next ebplus serve or deploy")
        from ebplus.replicas.board import BOARD_NAME, get_board

        board = get_board()
        if board is not None:  # it holds nothing the replicas would not publish again
            ray.kill(board, no_restart=True)
            log(f"phase board {BOARD_NAME!r} stopped")
    finally:
        ray.shutdown()
    log("done; Ray and Ray Serve still run (Ray's `serve shutdown` and `ray stop` remove them)")
    return 0


def run_serve(args: argparse.Namespace) -> int:
    cfg = _load(args, "serve")
    if cfg is None:
        return 2
    from ebplus.deploy.check import report

    status = report(cfg, args.config, check_only=args.check)  # offline checks, before Ray starts
    if status is not None:
        return status

    from ebplus.deploy.environment import vllm_build_conflict

    conflict = vllm_build_conflict()
    if conflict:
        raise CommandError(conflict)
    if not cfg.ray.address:  # the Ray cluster started here gets Ray Serve's throughput settings
        from ebplus.deploy import read_deadline, serve_env

        serve_env.apply()  # before Ray is imported: Ray Serve reads them at import
        # Ray Serve's proxy, which answers http.port, is started before the app: the deadline reaches it this way
        read_deadline.export(cfg.http.read_deadline_s)

    from ebplus.deploy.app import APP_NAME, model_path

    source = {}
    for model in cfg.models():
        cache = Path(model.model.cache_dir).expanduser().resolve()  # relative: to the working directory
        built = f" (built in {cache})" if model.model.source.startswith("builtin:") else ""
        say(f"model {model.model.source}{built} ...")
        with building(f"{model.where('model.source')} {model.model.source}"):
            source[model.model.id] = model_path(model, build=True)

    import ray
    from ray import serve

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    say("starting Ray ...")
    session_dir = start_ray(cfg.ray)
    for sig in (signal.SIGINT, signal.SIGTERM):  # again: ray.init installs its own SIGTERM handler, which exits at once
        signal.signal(sig, lambda *_: stop.set())
    say(f"Ray is up; its logs: {session_dir / 'logs'} (Serve and replicas: {session_dir / 'logs' / 'serve'})")
    try:
        took = deploy_app(cfg, source, session_dir, args.deploy_timeout, "serve", stop.is_set)
        if not stop.is_set():
            say(f"deployed in {took:.0f} s")
            print(banner(cfg, ray.get_runtime_context().gcs_address), flush=True)
        while not stop.wait(1.0):
            pass
        say("shutting down ...")
    finally:
        try:
            if cfg.ray.address:
                serve.delete(APP_NAME)  # a shared cluster keeps its other apps
            else:
                serve.shutdown()
            ray.shutdown()
        finally:
            if not cfg.ray.address:
                from ebplus.deploy import serve_env

                ended = serve_env.cleanup()
                if ended:
                    say(f"ended {len(ended)} HAProxy process(es) Ray's shutdown left running (pids {ended})")
    say("stopped")
    return 0
