"""EB+ inside plain ``vllm serve``: the ``vllm.endpoint_plugins`` entry point ``ebplus``.

::

    VLLM_PLUGINS=ebplus vllm serve MODEL \\
        --scheduler-cls ebplus.replicas.scheduler.EBPlusScheduler \\
        --additional-config '{"ebplus": {"scheduler": {"mode": "auto"}, "controller": {...}}}'

vLLM 0.29 has two plugin groups for this (``vllm/plugins/__init__.py``): a
``vllm.general_plugins`` entry installs the engine-side method (ours:
:func:`ebplus.replicas.control.install_engine_utility`, the ``ebplus_call``
utility that reaches the scheduler), and a ``vllm.endpoint_plugins`` entry adds
HTTP routes and state to the API server (this module). vLLM loads endpoint
plugins only when ``VLLM_PLUGINS`` names them.

In the API server process the plugin runs the same single-replica loop as a Ray
Serve replica (:mod:`ebplus.replicas.server`), with the controller in-process
instead of a Ray actor:

* the :class:`~ebplus.controller.actor.ControllerActor` (the Ray-free
  :class:`~ebplus.controller.fleet.FleetController` plus persistence), reached
  through a :class:`~ebplus.controller.client.ControllerClient` over a
  :class:`~ebplus.controller.client.LocalTransport`;
* a :class:`~ebplus.replicas.pump.TelemetryPump` that drains the scheduler through
  the engine client's utility channel (:class:`~ebplus.replicas.control.EngineControl`)
  every ``replicas.telemetry_interval_s`` and applies the controller's thresholds;
* the ``/admin/*`` routes of :mod:`ebplus.deploy.admin` with its auth rules, and the
  ``ebplus_*`` metrics (:mod:`ebplus.controller.exporter`) in vLLM's own Prometheus
  registry, so vLLM's ``/metrics`` serves both.

The ``ebplus`` object of ``--additional-config`` carries the deployment config's
``scheduler``, ``controller``, ``auth`` and (part of) ``replicas`` sections,
validated by the same models (:class:`PluginSettings`; ``EBPLUS_*`` variables are
the fallback, :mod:`ebplus.replicas.settings`). The engine core reads the
``scheduler`` and ``controller`` sections of the same object.

One API server process and one engine: with ``--api-server-count`` > 1 or data
parallelism each process would drain a share of the telemetry and run its own
controller, so the plugin refuses to start (:func:`check_topology`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from argparse import Namespace
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from fastapi import FastAPI
from prometheus_client import REGISTRY
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from pydantic import ConfigDict, Field, field_validator

from ebplus.controller import exporter
from ebplus.controller.actor import ControllerActor
from ebplus.controller.client import ControllerClient, LocalTransport
from ebplus.deploy import admin, read_deadline
from ebplus.deploy.auth import load_secret
from ebplus.deploy.config import DEFAULT_MAX_BODY_BYTES, READ_DEADLINE_HELP, AuthSection
from ebplus.deploy.middleware import BodySizeLimit, JsonBodyGuard
from ebplus.replicas import settings
from ebplus.replicas.budget import GENERATING_ROUTES, OutputBudget
from ebplus.replicas.cancellation import guard_add_request
from ebplus.replicas.compat import TopologyError, VllmVersionError, check_api_servers, check_vllm_version
from ebplus.replicas.config import ReplicaSection
from ebplus.replicas.control import EngineControl
from ebplus.replicas.profiles import prior_for_device
from ebplus.replicas.pump import TelemetryPump, arun_forever

# a child of vLLM's logger: our lines get the API server's prefix and format
logger = logging.getLogger("vllm.ebplus.plugin")

#: The plugin's name: the entry point in both groups, and what ``VLLM_PLUGINS`` lists.
PLUGIN_NAME = "ebplus"

#: Limit of one controller call in a push cycle (the in-process transport answers at once; kept for arun's contract).
PUSH_TIMEOUT_S = 2.0

#: ``replicas.*`` keys that mean something under plain vLLM (the others size a Ray deployment).
REPLICA_KEYS = frozenset(
    {"profile", "profiles", "telemetry_interval_s", "telemetry_buffer", "telemetry_sampling", "max_request_output"}
)


class PluginError(RuntimeError):
    """The plugin cannot run EB+ in this server; the message says why and what to change."""


class PluginSettings(settings.EngineSettings):
    """The ``ebplus`` object of ``--additional-config`` as the API server reads it.

    The engine core reads ``scheduler`` and ``controller`` from the same object
    (:class:`~ebplus.replicas.settings.EngineSettings`, which ignores the rest);
    here every key is checked, so a typo fails the start instead of being ignored.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    auth: AuthSection = Field(default_factory=AuthSection, description="Where the admin token comes from.")
    replicas: ReplicaSection = Field(
        default_factory=ReplicaSection,
        description="Only profile, profiles, max_request_output and the telemetry_* keys apply to one vLLM server.",
    )
    max_body_bytes: int = Field(
        DEFAULT_MAX_BODY_BYTES,
        ge=1024,
        description="Larger request bodies are refused with 413 on every route, before they are read in full.",
    )
    read_deadline_s: float = Field(read_deadline.DEFAULT_READ_DEADLINE_S, gt=0, description=READ_DEADLINE_HELP)

    @field_validator("replicas")
    @classmethod
    def _plain_vllm_keys(cls, value: ReplicaSection) -> ReplicaSection:
        unused = sorted(value.model_fields_set - REPLICA_KEYS)
        if unused:
            raise ValueError(
                f"{', '.join(unused)} size a Ray Serve deployment and do not apply to one vLLM server "
                f"(allowed here: {', '.join(sorted(REPLICA_KEYS))})"
            )
        return value


def load_settings(additional_config: Any) -> PluginSettings:
    """:class:`PluginSettings` from vLLM's ``additional_config`` (``EBPLUS_*`` when it has no ``ebplus``)."""
    try:
        return settings.read(PluginSettings, additional_config)
    except settings.SettingsError as exc:
        raise PluginError(str(exc)) from None


def check_topology(vllm_config: Any, args: Namespace | None = None) -> None:
    """Refuse more than one API server process or engine: EB+ runs one loop per engine.

    With ``--api-server-count N`` vLLM starts N API server processes in front of
    one engine: each would drain part of its telemetry and run its own controller,
    and the ``ebplus_*`` metrics could not join vLLM's multi-process ``/metrics``.
    With data parallelism the utility channel reaches one engine of several.
    """
    parallel = vllm_config.parallel_config
    servers = max(int(getattr(parallel, "_api_process_count", 1) or 1), int(getattr(args, "api_server_count", 1) or 1))
    try:
        check_api_servers(servers)
    except TopologyError as exc:
        raise PluginError(str(exc)) from None
    if int(parallel.data_parallel_size) > 1:
        raise PluginError(
            f"--data-parallel-size is {parallel.data_parallel_size}: EB+ drives one engine per server. Run one "
            "vLLM server per engine, or use `ebplus serve` (Ray Serve), whose controller spans the replicas"
        )


def check_scheduler(vllm_config: Any) -> None:
    """The engine must run our scheduler: otherwise there is nothing to drain or steer."""
    from vllm.utils.import_utils import resolve_obj_by_qualname

    from ebplus.replicas.scheduler import EBPlusScheduler

    name = vllm_config.scheduler_config.scheduler_cls
    cls = resolve_obj_by_qualname(name) if isinstance(name, str) else name
    if not (isinstance(cls, type) and issubclass(cls, EBPlusScheduler)):
        raise PluginError(
            f"VLLM_PLUGINS names {PLUGIN_NAME!r} but the engine's scheduler is {name or 'vLLM default'}: "
            f"add --scheduler-cls {settings.SCHEDULER_CLS}"
        )


class ControllerMetrics(Collector):
    """The controller's ``ebplus_*`` families, read at each scrape of vLLM's registry.

    Scrapes run on the API server's event loop, like the controller, and read its
    view (:meth:`ControllerActor.view`): one state, even while the controller's
    worker thread re-plans. ``describe`` is empty: vLLM's names (``vllm:*``) and
    ours (``ebplus_*``) cannot clash, and describing would run a snapshot at
    registration.
    """

    def __init__(self, controller: ControllerActor, model_id: str) -> None:
        self.controller = controller
        self.model_id = model_id

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        try:
            snapshot = self.controller.view()
        except Exception:  # a scrape must not fail vLLM's own metrics
            logger.exception("EB+ controller snapshot failed; ebplus_controller_up is 0")
            snapshot = None
        yield from exporter.families(snapshot, self.model_id)


class EBPlusRuntime:
    """The plugin's state in one API server: controller, telemetry pump, admin service, metrics.

    Args:
        engine_client: vLLM's ``AsyncLLM`` (its engine core runs our scheduler).
        config: the validated ``ebplus`` object.
        model_id: the served model name (the ``model_name`` label of the metrics).
    """

    def __init__(self, engine_client: Any, config: PluginSettings, model_id: str) -> None:
        self.config = config
        self.model_id = model_id
        self.controller = ControllerActor(config.controller)
        self.client = ControllerClient(LocalTransport(self.controller))
        section = config.replicas
        self.pump = TelemetryPump(
            replica_id(),
            config.scheduler.mode,
            prior=lambda device: prior_for_device(section, device),
            capacity=section.telemetry_buffer,
            sampling=section.telemetry_sampling.sampling(),
            model=model_id,
        )
        self.control = EngineControl(engine_client)
        self.budget = OutputBudget.for_engine(engine_client.vllm_config, section.max_request_output)
        self.engine_stopped = lambda: bool(engine_client.errored)
        self.metrics = ControllerMetrics(self.controller, model_id)
        self.task: asyncio.Task | None = None

    def install(self) -> None:
        """Serve ``/admin`` from this runtime and add its metrics to vLLM's registry."""
        auth = self.config.auth
        token = load_secret(auth.admin_token_env, auth.admin_token_file)
        admin.install_service(admin.AdminService(self.client, token, self.model_id))
        _register_metrics(self.metrics)
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            # vLLM then serves /metrics from the processes' metric files, not from this registry
            logger.warning("PROMETHEUS_MULTIPROC_DIR is set: vLLM's /metrics will not carry the ebplus_* metrics")
        if not token.configured:
            logger.warning("EB+ admin mutations are disabled: no admin token in %s", token.source)

    def start(self) -> None:
        interval = self.config.replicas.telemetry_interval_s
        loop = asyncio.get_running_loop()
        self.task = loop.create_task(
            arun_forever(self.pump, self.control, self.client, interval, PUSH_TIMEOUT_S, logger, self.engine_stopped),
            name="ebplus-telemetry",
        )
        logger.info(
            "EB+ controller running in this API server: replica %s, mode %s, telemetry every %.2f s",
            self.pump.replica_id,
            self.config.scheduler.mode.value,
            interval,
        )

    async def stop(self) -> None:
        """Stop pushing and keep the controller's state if it has a store.

        vLLM 0.29 runs this at the HTTP app's shutdown, after it stopped the engine: the
        telemetry task has usually ended by itself then (``engine_stopped``), quietly."""
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            self.task = None
        try:
            self.controller.persist(force=True)
        except Exception:  # shutting down: report, do not mask vLLM's own shutdown
            logger.exception("could not persist the EB+ controller state")


_registered: ControllerMetrics | None = None


def _register_metrics(collector: ControllerMetrics) -> None:
    """Put ``collector`` in the registry vLLM's ``/metrics`` serves (one per process)."""
    global _registered
    if _registered is not None:
        REGISTRY.unregister(_registered)
    REGISTRY.register(collector)
    _registered = collector


def replica_id() -> str:
    """Unique per server start: a restarted engine's telemetry restarts its record counts at zero."""
    return f"vllm-{socket.gethostname()}-{uuid.uuid4().hex[:6]}"


def served_model_name(vllm_config: Any, args: Namespace | None) -> str:
    """The first name ``/v1/models`` lists, as vLLM's API server derives it from its arguments.

    Not ``model_config.served_model_name``: with ``HF_HUB_OFFLINE`` vLLM resolves a Hub
    id to its snapshot directory there, while the API server still serves the id.
    """
    names = getattr(args, "served_model_name", None) or [getattr(args, "model", None)]
    name = names[0] if isinstance(names, list | tuple) else names
    if not name:
        name = vllm_config.model_config.served_model_name
        name = name[0] if isinstance(name, list | tuple) else name
    return str(name)


def share_vllm_logging() -> None:
    """Print EB+'s own lines (the ``ebplus`` loggers: the controller's full disk and recovery, a corrupt state set
    aside, a resume) through vLLM's handlers, at vLLM's level, as the plugin's own lines are.

    vLLM configures only its ``vllm`` logger: without this, ``ebplus.controller``'s errors reach stderr through
    Python's last-resort handler as bare messages (no level, no time), and its info lines (``controller resumed``)
    not at all. An ``ebplus`` logger that has handlers already (an operator's logging config) is left alone.
    """
    ours, theirs = logging.getLogger("ebplus"), logging.getLogger("vllm")
    if ours.handlers or not theirs.handlers:
        return
    for handler in theirs.handlers:
        ours.addHandler(handler)
    ours.setLevel(theirs.getEffectiveLevel())
    ours.propagate = False


async def create_runtime(engine_client: Any, args: Namespace | None) -> EBPlusRuntime:
    """Every start-up check, then the runtime (not yet pushing: :meth:`EBPlusRuntime.start`).

    Raises:
        PluginError: the server cannot run EB+; the message names the flag or key to change.
    """
    try:
        check_vllm_version()
    except VllmVersionError as exc:
        raise PluginError(str(exc)) from None
    share_vllm_logging()  # before the controller is built: its store reports a corrupt state as it loads
    vllm_config = engine_client.vllm_config
    check_topology(vllm_config, args)
    check_scheduler(vllm_config)
    config = load_settings(vllm_config.additional_config)
    guard_add_request(engine_client)  # a client gone while its request is added leaves no work behind
    return EBPlusRuntime(engine_client, config, served_model_name(vllm_config, args))


class EBPlusEndpoint:
    """The ``vllm.endpoint_plugins`` entry point (vLLM's ``EndpointPlugin`` protocol)."""

    name = PLUGIN_NAME
    # the CPU-only render server has no engine to steer
    required_tasks = ("generate",)

    def __init__(self) -> None:
        self.runtime: EBPlusRuntime | None = None

    def attach_router(self, app: FastAPI) -> None:
        """Add ``/admin/*`` and the request guards, and run the telemetry loop for as long as the app serves.

        The guards see every route, vLLM's included: a body over ``max_body_bytes`` is
        refused before it is read (FastAPI would read a ``PUT /admin/overrides`` body in
        full before its auth dependency runs, on the serving loop), and a generating
        request over the output budget is refused before vLLM parses it.
        """
        app.include_router(admin.admin_router())
        app.add_middleware(JsonBodyGuard, check=self.check_body, paths=(*GENERATING_ROUTES, "/admin"))
        app.add_middleware(BodySizeLimit, max_bytes=self.max_body_bytes)  # added last: the outermost
        app.router.lifespan_context = _with_loop(app.router.lifespan_context, self)

    def max_body_bytes(self) -> int:
        """The configured limit once the settings are read (the default before)."""
        return DEFAULT_MAX_BODY_BYTES if self.runtime is None else self.runtime.config.max_body_bytes

    def check_body(self, path: str, body: object) -> str | None:
        """The output budget of a generating request (a 400's reason, or ``None``)."""
        runtime = self.runtime
        if runtime is None or path not in GENERATING_ROUTES or not isinstance(body, dict):
            return None
        return runtime.budget.problem(body.get)

    async def init_state(self, engine_client: Any, state: Any, args: Namespace) -> None:
        """Check the server and build the runtime; a server that cannot run EB+ stops with one line."""
        if engine_client is None:
            return
        try:
            self.runtime = await create_runtime(engine_client, args)
        except PluginError as exc:
            logger.error("EB+ plugin: %s", exc)
            raise SystemExit(f"EB+ plugin: {exc}") from None
        self.runtime.install()
        state.ebplus = self.runtime
        # vLLM's uvicorn server starts after this, in this process: every connection it accepts is watched
        read_deadline.install(self.runtime.config.read_deadline_s)


def _with_loop(inner: Callable[[Any], Any], plugin: EBPlusEndpoint) -> Callable[[Any], Any]:
    """``inner`` (vLLM's lifespan) with the plugin's loop inside it: started once the app serves,
    stopped before vLLM tears its state down (as vLLM does with its own stats task)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[Any]:
        async with inner(app) as value:
            runtime = plugin.runtime
            if runtime is not None:
                runtime.start()
            try:
                yield value
            finally:
                if runtime is not None:
                    await runtime.stop()

    return lifespan
