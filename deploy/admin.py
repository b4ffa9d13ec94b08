"""The admin REST API and ``/metrics``: the operator's view of the controller.

Routes (all JSON except ``/metrics``):

* ``GET  /admin/thresholds``          per-replica mode, k, N, theta0/Delta theta/theta*, versions
* ``GET  /admin/estimates``           fleet p0, eta, mu_L, mu_O and per-replica cost models
* ``GET  /admin/history?limit=N``     the newest decisions with their inputs
* ``GET  /admin/routing``             this ingress process's board routers: boards, decisions, fallbacks
* ``PUT  /admin/overrides``           pin mode/k/N for a replica or ``"*"``, optional TTL
* ``DELETE /admin/overrides/{id}``    remove a pin
* ``POST /admin/recompute``           re-estimate now
* ``GET  /metrics``                   Prometheus exposition of the same snapshot

Auth: ``Authorization: Bearer <token>`` (constant-time compare) on every
``/admin`` route when a token is configured; without one, reads work and
mutations answer 403. ``/metrics`` is open for Prometheus.

The router talks to the controller through a typed
:class:`~ebplus.controller.client.ControllerClient`, so the same routes serve the
Ray actor in production, the in-process controller of the plain-vLLM plugin, and
tests.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from fastapi.exception_handlers import http_exception_handler, request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field

from ebplus.controller import exporter
from ebplus.controller.client import ControllerClient, ControllerUnavailable
from ebplus.controller.estimator import Estimate
from ebplus.controller.overrides import Override
from ebplus.controller.scaling import ScalingDecision
from ebplus.controller.views import ClearResult, Decision, OverrideResult, RecomputeResult, ReplicaView, StaggerView
from ebplus.deploy import routing as routing_policies
from ebplus.deploy.auth import Secret, bearer_token

logger = logging.getLogger("ray.serve.ebplus")

T = TypeVar("T")


class AdminService:
    """What the routes need: a controller client, the admin secret, the model name."""

    def __init__(self, client: ControllerClient, admin_token: Secret, model_id: str) -> None:
        self.client = client
        self.admin_token = admin_token
        self.model_id = model_id

    async def call(self, fn: Callable[[ControllerClient], Awaitable[T]]) -> T:
        """``fn(client)``, or a 503 with ``Retry-After`` when the controller does not answer."""
        try:
            return await fn(self.client)
        except ControllerUnavailable as exc:
            # why stays in the server's log: Ray's error lines carry the actor's pid, node address and id
            logger.warning("admin request: controller unavailable: %s", exc)
            raise HTTPException(
                status_code=503,
                detail="controller unavailable (restarting, paused or gone); retry",
                headers={"Retry-After": "2"},
            ) from None


# The ingress installs its service here at start; tests override the dependency.
_service: AdminService | None = None


def install_service(service: AdminService) -> None:
    global _service
    _service = service


def get_service() -> AdminService:
    if _service is None:
        raise HTTPException(status_code=503, detail="admin API not initialised", headers={"Retry-After": "2"})
    return _service


Service = Annotated[AdminService, Depends(get_service)]


def _authorize(service: AdminService, request: Request, mutation: bool) -> None:
    token = service.admin_token
    if not token.configured:
        if mutation:
            raise HTTPException(
                status_code=403,
                detail="admin mutations are disabled: no admin token is configured "
                "(set the environment variable or file named in auth.admin_token_env / auth.admin_token_file)",
            )
        return
    if not token.matches(bearer_token(request.headers.get("authorization"))):
        raise HTTPException(
            status_code=401, detail="missing or invalid admin token", headers={"WWW-Authenticate": "Bearer"}
        )


def read_access(request: Request, service: Service) -> AdminService:
    _authorize(service, request, mutation=False)
    return service


def write_access(request: Request, service: Service) -> AdminService:
    _authorize(service, request, mutation=True)
    return service


Reader = Annotated[AdminService, Depends(read_access)]
Writer = Annotated[AdminService, Depends(write_access)]


# ---------------------------------------------------------------------------
# schemas


class ThresholdsResponse(BaseModel):
    version: int = Field(description="The controller's current decision version.")
    replicas: dict[str, ReplicaView] = Field(description="Per replica: thresholds, their inputs and the engine.")
    overrides: dict[str, Override] = Field(description="Operator overrides in force, by replica id or '*'.")
    stagger: StaggerView | None = Field(
        None, description="Whether the EB replicas' prefill windows are staggered, why, and the period and phases."
    )


class FleetEstimate(BaseModel):
    estimate: Estimate | None = Field(description="The latest workload estimate; null before the first.")
    first_estimate: Estimate | None = Field(description="The estimate of the first update, to compare with.")
    updates: int = Field(description="Re-estimations so far.")
    completions: int = Field(description="Completions observed so far.")


class ReplicaCost(BaseModel):
    theta_star: float | None = Field(description="theta* its last plan came to from the estimate (null: none yet).")
    cost_model: Any = Field(description="The cost model its last plan used.")
    cost_fitted: list[str] = Field(description="Which parts came from its own steps.")
    concurrency: float | None
    kv_capacity_tokens: int
    device: str


class EstimatesResponse(BaseModel):
    fleet: FleetEstimate
    replicas: dict[str, ReplicaCost] = Field(description="Per replica: fitted cost model, which parts came from data.")


class HistoryResponse(BaseModel):
    decisions: list[Decision] = Field(description="The newest decisions, oldest first.")
    scaling: list[ScalingDecision] = Field(
        default_factory=list,
        description=(
            "Policy-first autoscaling's newest decisions, oldest first: the replicas running and asked for, the "
            "action (up, down, hold, policy), the demand and capacities (tokens/s) and why."
        ),
    )


class HealthResponse(BaseModel):
    status: str
    controller: bool = Field(description="Whether the controller answered (serving does not need it).")
    version: int | None


class OverrideRequest(BaseModel):
    """Pin mode, k and/or N. Fields left out keep the controller's value."""

    model_config = ConfigDict(extra="forbid")

    replica: str = Field(min_length=1, description='Replica id, or "*" for the whole fleet.')
    mode: Literal["mb", "eb", "v0", "auto", "shadow"] | None = None
    k: int | None = Field(None, ge=1, description="EB threshold, 1 <= k <= N.")
    n: int | None = Field(None, ge=1, description="Cap on running requests; above the KV-safe N* needs force.")
    ttl_s: float | None = Field(None, gt=0, le=30 * 86400, description="Seconds until the override expires.")
    force: bool = Field(False, description="Allow N above the KV-safe maximum.")


def _unprocessable(field: str, message: str) -> HTTPException:
    return HTTPException(status_code=422, detail=[{"loc": ["body", field], "msg": message, "type": "value_error"}])


# ---------------------------------------------------------------------------
# routes


class AdminRoute(APIRoute):
    """A route that answers its own errors in FastAPI's shape, whatever app hosts it.

    ``{"detail": ...}`` bodies, 422 with the field's location for a bad body, and
    the ``WWW-Authenticate`` / ``Retry-After`` headers - what the API documents.
    Needed under plain vLLM: its app-wide handlers turn every ``HTTPException``
    into an OpenAI error object (dropping the headers) and a 422 into a 400.
    """

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except HTTPException as exc:
                return await http_exception_handler(request, exc)
            except RequestValidationError as exc:
                return await request_validation_exception_handler(request, exc)

        return handle


router = APIRouter(route_class=AdminRoute)


@router.get("/admin/thresholds", response_model=ThresholdsResponse, tags=["admin"])
async def thresholds(service: Reader) -> ThresholdsResponse:
    """Current thresholds of every replica, and the overrides in force."""
    snap = await service.call(lambda c: c.snapshot())
    return ThresholdsResponse(
        version=snap.version, replicas=snap.replicas, overrides=snap.overrides, stagger=snap.stagger
    )


@router.get("/admin/estimates", response_model=EstimatesResponse, tags=["admin"])
async def estimates(service: Reader) -> EstimatesResponse:
    """The fleet's workload estimate and each replica's cost model."""
    snap = await service.call(lambda c: c.snapshot())
    fleet = FleetEstimate(
        estimate=snap.estimate, first_estimate=snap.first_estimate, updates=snap.updates, completions=snap.completions
    )
    replicas = {
        rid: ReplicaCost(
            theta_star=r.theta_star,
            cost_model=r.cost_model,
            cost_fitted=r.cost_fitted,
            concurrency=r.concurrency,
            kv_capacity_tokens=r.kv_capacity_tokens,
            device=r.device,
        )
        for rid, r in snap.replicas.items()
    }
    return EstimatesResponse(fleet=fleet, replicas=replicas)


@router.get("/admin/history", response_model=HistoryResponse, tags=["admin"])
async def history(service: Reader, limit: Annotated[int, Query(ge=1, le=10_000)] = 50) -> HistoryResponse:
    """The newest decisions (inputs -> outputs), oldest first; and the autoscaling policy's."""
    decisions = await service.call(lambda c: c.history(limit))
    return HistoryResponse(decisions=decisions, scaling=await service.call(lambda c: c.scaling_decisions(limit)))


@router.put("/admin/overrides", response_model=OverrideResult, tags=["admin"])
async def put_override(body: OverrideRequest, service: Writer) -> OverrideResult:
    """Pin mode/k/N for a replica or the fleet. Invalid combinations answer 422 naming the field."""
    fields = body.model_dump(exclude={"replica"})
    result = await service.call(lambda c: c.set_override(body.replica, **fields))
    if result.error is not None:
        raise _unprocessable(result.error, result.message or "invalid")
    return result


@router.delete("/admin/overrides/{replica}", response_model=ClearResult, tags=["admin"])
async def delete_override(replica: str, service: Writer) -> ClearResult:
    """Remove the override of a replica (or ``*``)."""
    result = await service.call(lambda c: c.clear_override(replica))
    if not result.removed:
        raise HTTPException(status_code=404, detail=f"no override for {replica!r}")
    return result


@router.post("/admin/recompute", response_model=RecomputeResult, tags=["admin"])
async def recompute(service: Writer) -> RecomputeResult:
    """Re-estimate the workload and re-plan every replica now."""
    return await service.call(lambda c: c.recompute())


class RoutingResponse(BaseModel):
    """The board routers of the ingress process that answered (each ingress replica routes on its own)."""

    routers: list[dict[str, Any]] = Field(
        description=(
            "Per router (one per model deployment): its policy and load cap (routing.load_cap; null: none, or "
            "not the phase policy), decisions, fallbacks to power of two choices, "
            "decision time percentiles (microseconds, board lookup included) and the boards it holds now; "
            "empty under Ray's default router."
        )
    )


@router.get("/admin/routing", response_model=RoutingResponse, tags=["admin"])
async def routing(service: Reader) -> RoutingResponse:
    """What the phase-aware (or least-loaded) routers of this ingress process see and decide."""
    return RoutingResponse(routers=[r.view() for r in list(routing_policies.LIVE)])


@router.get("/metrics", tags=["observability"], response_class=Response)
async def metrics(service: Service) -> Response:
    """Prometheus metrics (``ebplus_*``); ``ebplus_controller_up 0`` while the controller is away."""
    try:
        snap = await service.client.snapshot()
    except ControllerUnavailable:
        snap = None
    return Response(exporter.render(snap, service.model_id), media_type="text/plain; version=0.0.4; charset=utf-8")


@router.get("/health", response_model=HealthResponse, tags=["observability"])
async def health(service: Service) -> HealthResponse:
    """Liveness of the HTTP layer, and whether the controller answers (serving does not need it)."""
    try:
        ping = await service.client.ping()
    except ControllerUnavailable:
        ping = None
    return HealthResponse(status="ok", controller=ping is not None, version=None if ping is None else ping.version)


def admin_router() -> APIRouter:
    """The ``/admin`` routes alone, for a server with its own ``/metrics`` and ``/health``
    (the plain-vLLM plugin adds them to vLLM's app; our metrics join vLLM's registry)."""
    admin_only = APIRouter()
    # /admin/routing shows Ray Serve's request routers: a vLLM server has none
    admin_only.routes.extend(
        route
        for route in router.routes
        if getattr(route, "path", "").startswith("/admin") and getattr(route, "path", "") != "/admin/routing"
    )
    return admin_only
