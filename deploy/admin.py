"""The admin REST API and ``/metrics``: the operator's view of the controller.

Routes (all JSON except ``/metrics``):

* ``GET  /admin/thresholds``          per-replica mode, k, N, theta0/Delta theta/theta*, versions
* ``GET  /admin/estimates``           fleet p0, eta, mu_L, mu_O and per-replica cost models
* ``GET  /admin/history?limit=N``     the newest decisions with their inputs
* ``PUT  /admin/overrides``           pin mode/k/N for a replica or ``"*"``, optional TTL
* ``DELETE /admin/overrides/{id}``    remove a pin
* ``POST /admin/recompute``           re-estimate now
* ``GET  /metrics``                   Prometheus exposition of the same snapshot

Auth: ``Authorization: Bearer <token>`` (constant-time compare) on every
``/admin`` route when a token is configured; without one, reads work and
mutations answer 403. ``/metrics`` is open for Prometheus.

The router talks to the controller through a :class:`ControllerClient`, so the
same routes serve a Ray actor in production and an in-process
:class:`~controller.actor.ControllerActor` in tests.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal, Protocol

from ebplus.controller import exporter
from ebplus.deploy.auth import Secret, bearer_token
from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

CONTROLLER_TIMEOUT_S = 5.0


class ControllerUnavailable(Exception):
    """The controller did not answer (restarting, or gone)."""


class ControllerClient(Protocol):
    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any: ...


class LocalControllerClient:
    """Calls an in-process :class:`~controller.actor.ControllerActor` (tests, simulator)."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return await getattr(self.actor, method)(*args, **kwargs)


class RayControllerClient:
    """Calls the named controller actor; resolves it lazily so a restart is transparent."""

    def __init__(self, timeout_s: float = CONTROLLER_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._handle: Any = None

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        from ebplus.controller.actor import get_controller
        from ray.exceptions import RayError

        if self._handle is None:
            self._handle = get_controller()
            if self._handle is None:
                raise ControllerUnavailable("controller actor not found")
        try:
            ref = getattr(self._handle, method).remote(*args, **kwargs)
            return await asyncio.wait_for(ref, self.timeout_s)
        except (TimeoutError, RayError) as exc:
            self._handle = None  # look it up again next time
            raise ControllerUnavailable(str(exc)) from None


class AdminService:
    """What the routes need: a controller client, the admin secret, the model name."""

    def __init__(self, client: ControllerClient, admin_token: Secret, model_id: str) -> None:
        self.client = client
        self.admin_token = admin_token
        self.model_id = model_id

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return await self.client.call(method, *args, **kwargs)
        except ControllerUnavailable as exc:
            raise HTTPException(
                status_code=503,
                detail=f"controller unavailable: {exc}",
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


class ReplicaThresholds(BaseModel):
    mode: str = Field(description="Configured mode: mb | eb | v0 | auto.")
    active: str = Field(description="Policy the replica runs: mb or eb.")
    k: int = Field(description="EB threshold.")
    n: int = Field(description="Cap on running requests.")
    theta0: float | None = Field(description="CFR threshold fraction (eq. 3); null before the first estimate.")
    delta_theta: float | None = Field(description="IFR correction (eq. 5), clamped.")
    theta_star: float | None = Field(description="theta0 + Delta theta, clamped.")
    version: int = Field(description="Version the controller publishes.")
    applied_version: int = Field(description="Version the replica reports applied (-1: none yet).")
    updated_at: float = Field(description="Unix time of the last decision for this replica.")
    device: str = Field(description="Accelerator the replica reported.")
    reason: str | None = Field(description="Why the last EB/MB decision came out as it did.")


class ThresholdsResponse(BaseModel):
    version: int
    replicas: dict[str, ReplicaThresholds]
    overrides: dict[str, dict]


class EstimatesResponse(BaseModel):
    fleet: dict = Field(description="p0, eta, mu_l, mu_o, n_samples, updates, fit method and range.")
    replicas: dict[str, dict] = Field(description="Per replica: fitted cost model, which parts came from data.")


class OverrideRequest(BaseModel):
    """Pin mode, k and/or N. Fields left out keep the controller's value."""

    model_config = ConfigDict(extra="forbid")

    replica: str = Field(min_length=1, description='Replica id, or "*" for the whole fleet.')
    mode: Literal["mb", "eb", "v0", "auto"] | None = None
    k: int | None = Field(None, ge=1, description="EB threshold, 1 <= k <= N.")
    n: int | None = Field(None, ge=1, description="Cap on running requests; above the KV-safe N* needs force.")
    ttl_s: float | None = Field(None, gt=0, le=30 * 86400, description="Seconds until the override expires.")
    force: bool = Field(False, description="Allow N above the KV-safe maximum.")


def _unprocessable(field: str, message: str) -> HTTPException:
    return HTTPException(status_code=422, detail=[{"loc": ["body", field], "msg": message, "type": "value_error"}])


# ---------------------------------------------------------------------------
# routes

router = APIRouter()


@router.get("/admin/thresholds", response_model=ThresholdsResponse, tags=["admin"])
async def thresholds(service: Reader) -> dict:
    """Current thresholds of every replica, and the overrides in force."""
    snap = await service.call("snapshot")
    return {"version": snap["version"], "replicas": snap["replicas"], "overrides": snap["overrides"]}


@router.get("/admin/estimates", response_model=EstimatesResponse, tags=["admin"])
async def estimates(service: Reader) -> dict:
    """The fleet's workload estimate and each replica's cost model."""
    snap = await service.call("snapshot")
    fleet = {**(snap["estimate"] or {}), "updates": snap["updates"], "completions": snap["completions"]}
    for key in ("p0", "eta", "mu_l", "mu_o", "n_samples"):
        fleet.setdefault(key, None)
    replicas = {
        rid: {
            "cost_model": r["cost_model"],
            "cost_fitted": r["cost_fitted"],
            "concurrency": r["concurrency"],
            "kv_capacity_tokens": r["kv_capacity_tokens"],
            "device": r["device"],
        }
        for rid, r in snap["replicas"].items()
    }
    return {"fleet": fleet, "replicas": replicas}


@router.get("/admin/history", tags=["admin"])
async def history(service: Reader, limit: Annotated[int, Query(ge=1, le=10_000)] = 50) -> dict:
    """The newest decisions (inputs -> outputs), oldest first."""
    return {"decisions": await service.call("history", limit)}


@router.put("/admin/overrides", tags=["admin"])
async def put_override(body: OverrideRequest, service: Writer) -> dict:
    """Pin mode/k/N for a replica or the fleet. Invalid combinations answer 422 naming the field."""
    result = await service.call(
        "set_override", body.replica, mode=body.mode, k=body.k, n=body.n, ttl_s=body.ttl_s, force=body.force
    )
    if "error" in result:
        raise _unprocessable(result["error"], result["message"])
    return result


@router.delete("/admin/overrides/{replica}", tags=["admin"])
async def delete_override(replica: str, service: Writer) -> dict:
    """Remove the override of a replica (or ``*``)."""
    result = await service.call("clear_override", replica)
    if not result["removed"]:
        raise HTTPException(status_code=404, detail=f"no override for {replica!r}")
    return result


@router.post("/admin/recompute", tags=["admin"])
async def recompute(service: Writer) -> dict:
    """Re-estimate the workload and re-plan every replica now."""
    return await service.call("recompute")


@router.get("/metrics", tags=["observability"], response_class=Response)
async def metrics(service: Service) -> Response:
    """Prometheus metrics (``ebplus_*``); ``ebplus_controller_up 0`` while the controller is away."""
    try:
        snap = await service.client.call("snapshot")
    except ControllerUnavailable:
        snap = None
    return Response(exporter.render(snap, service.model_id), media_type="text/plain; version=0.0.4; charset=utf-8")


@router.get("/health", tags=["observability"])
async def health(service: Service) -> dict:
    """Liveness of the HTTP layer, and whether the controller answers (serving does not need it)."""
    try:
        ping = await service.client.call("ping")
    except ControllerUnavailable:
        ping = None
    return {"status": "ok", "controller": ping is not None, "version": None if ping is None else ping["version"]}
