"""The HTTP surface: Ray Serve LLM's OpenAI ingress plus ``/health``, ``/admin/*`` and ``/metrics``.

We keep the ecosystem's ``OpenAiIngress`` (model routing, streaming, OpenAI error
format) and add our routes and guards to the same FastAPI app, so one port
serves everything.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from ray.exceptions import ObjectLostError, RayActorError

# NOTE: Ray Serve LLM's public API (ray.serve.llm) where it has the name; private modules only for
# what it does not export (pinned ray==2.60.0):
# * ChatCompletionRequest: the public class is a subclass of this one, but the stock ingress parses
#   request bodies into this one, so only it serves for isinstance();
# * DEFAULT_ENDPOINTS, init(): the stock route table (we keep its text routes) and the FastAPI app
#   with Ray's OpenAI error handling and request-id middleware, which make_fastapi_ingress uses;
# * _sanitize_chat_completion_request: the stock ingress' own pre-processing, run early to turn a
#   500 into a 400;
# * ModelList: the /v1/models answer, which EBPlusIngress.models builds to list local LoRA adapters;
# * OpenAIHTTPException: what the stock ingress raises with a status (passed through, not made a 500).
from ray.llm._internal.serve.core.configs.openai_api_models import (
    ChatCompletionRequest,
    ModelList,
    OpenAIHTTPException,
)
from ray.llm._internal.serve.core.ingress.ingress import DEFAULT_ENDPOINTS, init
from ray.llm._internal.serve.core.ingress.utils import _sanitize_chat_completion_request
from ray.serve.exceptions import RayServeException
from ray.serve.llm.ingress import OpenAiIngress, make_fastapi_ingress
from ray.serve.llm.openai_api_models import ErrorResponse
from starlette.exceptions import HTTPException

from ebplus.controller.actor import RayTransport
from ebplus.controller.client import ControllerClient
from ebplus.deploy import admin, read_deadline
from ebplus.deploy.admin import AdminService
from ebplus.deploy.auth import load_secret
from ebplus.deploy.config import AuthSection
from ebplus.deploy.middleware import ApiKeyGuard, BodySizeLimit, ErrorResponses, JsonBodyGuard
from ebplus.replicas import lora
from ebplus.replicas.heartbeat import NoProgress, ReplicaStalled, without_heartbeats

logger = logging.getLogger("ray.serve.ebplus")

#: Replica methods that answer with heartbeats, by the stock method they wrap (see ebplus.replicas.heartbeat).
WITH_HEARTBEATS = {"chat": "chat_with_heartbeats", "completions": "completions_with_heartbeats"}

# The OpenAI routes of a text-generation deployment (no embeddings/audio/score).
OPENAI_ENDPOINTS = {
    name: DEFAULT_ENDPOINTS[name] for name in ("models", "model_data", "completions", "chat", "tokenize", "detokenize")
}


class EBPlusIngress(OpenAiIngress):
    """``OpenAiIngress`` that also installs the admin service for ``/admin`` and ``/metrics``.

    Args:
        auth: the ``auth:`` section of the config (env/file names, not secrets).
        model_id: served model name (the ``model`` label of the metrics).
        stall_timeout_s: a replica silent this long (no answer, no heartbeat) is given up on.
        progress_timeout_s: an answer that has not moved this long after its first item is given up on.
        read_deadline_s: a client stalled this long while sending its request is cut
            (:mod:`ebplus.deploy.read_deadline`).
    """

    def __init__(
        self,
        llm_deployments: dict[str, Any],
        model_cards: dict[str, Any],
        *,
        auth: AuthSection,
        model_id: str,
        stall_timeout_s: float,
        progress_timeout_s: float | None = None,
        lora_paths: dict[str, str] | None = None,
        read_deadline_s: float = read_deadline.DEFAULT_READ_DEADLINE_S,
    ) -> None:
        # before this process's HTTP server accepts connections (Ray starts a direct-ingress server after this)
        read_deadline.install(read_deadline_s)
        super().__init__(
            llm_deployments, model_cards, lora_paths=lora_paths, _get_lora_model_metadata_func=lora.adapter_metadata
        )
        self._stall_timeout_s = stall_timeout_s
        self._progress_timeout_s = progress_timeout_s
        # both credentials are read here, at the ingress' start in its own process, so a secret file that
        # cannot be read or is empty fails the deployment instead of leaving its routes open
        admin_token = load_secret(auth.admin_token_env, auth.admin_token_file)
        api_key = load_secret(auth.api_key_env, auth.api_key_file)
        if not api_key.configured:
            logger.warning("no API key in %s: /v1 answers anyone who can reach it", api_key.source)
        if not admin_token.configured:
            logger.warning("no admin token in %s: /admin reads are open, mutations disabled", admin_token.source)
        admin.install_service(AdminService(ControllerClient(RayTransport()), admin_token, model_id))

    async def models(self) -> ModelList:
        """Every base model and its adapters (the stock listing, which reads object storage only,
        with :func:`ebplus.replicas.lora.adapter_ids` that also reads a local adapter directory)."""
        cards = []
        for base_model_id in self._model_cards:
            cards.append(await self.model(base_model_id))
            base_path = self._lora_paths.get(base_model_id)
            for adapter_id in lora.adapter_ids(base_path, base_model_id) if base_path else ():
                card = await self.model(adapter_id)
                if card is not None:
                    cards.append(card)
        return ModelList(data=cards)

    async def _get_response(self, **kwargs: Any) -> AsyncGenerator[Any, None]:
        """The model's answer stream; whatever fails under a request ends it with an OpenAI error, never a cut or a hang.

        Serve re-routes a request whose replica died before accepting it. One that
        was already running there fails with ``ActorDiedError`` (or its result is
        lost with its node: ``ObjectLostError``), which the stock ingress answers
        with a 500 - and a stream that had started just stops, with no ``[DONE]``
        and no error, so a client takes a cut-off answer for a whole one. A replica
        whose node was lost may also say nothing at all until Ray declares the node
        dead, and a wedged engine under a live replica says nothing either; chat and
        completions are therefore asked of the replica with heartbeats, a stream
        silent for ``stall_timeout_s`` is given up on, and so is one whose answer has
        not moved for ``progress_timeout_s``. A lost replica becomes code 503
        (retryable: before the first chunk a 503 response with ``Retry-After``), a
        stuck one 504, anything else raised on the way (an engine error inside the
        replica: ``RayTaskError``) 500 with no internals. After the first chunk the
        error is an event that ends the stream and Ray's stream wrapper adds
        ``[DONE]`` (the OpenAI client raises ``APIError``; what was already streamed
        is incomplete).
        """
        problem = _chat_body_problem(kwargs.get("body"))
        if problem is not None:
            yield _error(problem, "BadRequestError", 400)
            return
        method = WITH_HEARTBEATS.get(kwargs.get("call_method", ""))
        if method is None:
            stream = super()._get_response(**kwargs)
        else:
            stream = without_heartbeats(
                super()._get_response(**{**kwargs, "call_method": method}),
                self._stall_timeout_s,
                self._progress_timeout_s,
            )
        started = False
        try:
            async for response in stream:
                started = True
                yield response
        except ANSWERED_UPSTREAM:
            if started:  # too late for the status it carries: end the stream with it as an error event
                yield _error("the request failed while streaming; retry the request", "ServiceUnavailable", 503)
                return
            raise  # an unknown model (404), Serve's back-pressure (503): answered as they are
        except REPLICA_LOST as exc:
            logger.warning("replica failed under a request: %s", str(exc).splitlines()[0])
            yield _error("the model replica serving this request failed; retry the request", "ServiceUnavailable", 503)
        except NoProgress as exc:
            logger.warning("request given up: %s", exc)
            yield _error(f"the model replica stopped answering: {exc}", "Timeout", 504)
        except Exception:
            logger.exception("request failed in the replica")
            yield _error("the server failed while answering; the server log has the details", "InternalServerError", 500)


#: What a request meets when its replica is gone (its actor died or its node was lost): retryable.
REPLICA_LOST = (RayActorError, ObjectLostError, ReplicaStalled)

#: Raised with a status the stock ingress and Serve's proxy already answer (routing, back-pressure, cancellation).
ANSWERED_UPSTREAM = (HTTPException, OpenAIHTTPException, RayServeException)


def _error(message: str, kind: str, code: int) -> ErrorResponse:
    """An OpenAI error the stock ingress answers as is (its ``error`` validates into Ray's ErrorInfo)."""
    return ErrorResponse(error={"message": message, "type": kind, "code": code})


def _chat_body_problem(body: Any) -> str | None:
    """Why a parsed chat request would still fail with a 500 further on, or ``None``.

    Content parts are validated lazily (pydantic's ``ValidatorIterator``): a part
    like ``null`` passes request parsing and fails when the stock ingress lists
    them, with a ValueError answered as a 500. Listing them here first (idempotent)
    turns that into a 400 with the same message. A message without a ``role``
    (harmony's shape) fails in the replica's renderer. Both found by schemathesis.
    """
    if not isinstance(body, ChatCompletionRequest):
        return None
    try:
        _sanitize_chat_completion_request(body)
    except (TypeError, ValueError) as exc:
        return f"invalid request: {exc}"
    for i, message in enumerate(body.messages):
        # A harmony-style message ({"author": {"role": ...}}) validates as a message type but
        # has no "role": the replica's chat renderer then fails with KeyError (a 500).
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            return f"invalid request: messages[{i}] needs a string 'role'"
    return None


#: Exceptions a request model's validator can raise on input of an unexpected shape.
_VALIDATOR_CRASHES = (TypeError, AttributeError, KeyError, IndexError)


def _raised_while_parsing_the_body(exc: BaseException) -> bool:
    """Whether ``exc`` came out of FastAPI validating the request (not out of the endpoint)."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name in ("request_body_to_args", "solve_dependencies"):
            return True
        tb = tb.tb_next
    return False


def install_body_crash_handlers(app: FastAPI) -> None:
    """Answer a request whose body crashes a validator with 400 (422 on ``/admin``), not 500.

    vLLM's request models check some fields in ``mode="before"`` validators that
    assume the field's shape: ``{"messages": null}`` or a content part that is
    ``null`` raise ``TypeError`` there, which pydantic does not turn into a
    validation error (found by schemathesis on the live deployment). Such an
    exception raised while FastAPI parses the body is the client's error; any
    other is re-raised and stays a 500.
    """

    async def body_crash(request: Request, exc: Exception) -> Response:
        if not _raised_while_parsing_the_body(exc):
            raise exc
        message = f"invalid request body: a field has an unexpected shape ({type(exc).__name__}: {exc})"
        if request.url.path.startswith("/admin"):
            return JSONResponse({"detail": [{"loc": ["body"], "msg": message, "type": "value_error"}]}, 422)
        return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "code": 400}}, 400)

    for exc_type in _VALIDATOR_CRASHES:
        app.add_exception_handler(exc_type, body_crash)


def make_app(max_body_bytes: int, auth: AuthSection, cors_allow_origins: Sequence[str] = ()) -> FastAPI:
    """The FastAPI app behind the ingress: Ray's OpenAI app, our routes, our guards.

    Secrets are loaded in the serving process on first use (see ``ApiKeyGuard``),
    never at build time, so they do not travel with the pickled app.

    Ray's app allows every origin *with credentials* (Starlette then echoes the
    request's ``Origin``): any web page a user opens could read the API, ``/admin``
    and ``/metrics`` with the user's network position. Its CORS middleware is taken
    out; browsers get cross-origin access only from ``cors_allow_origins``.
    """
    app = init()
    app.user_middleware = [m for m in app.user_middleware if m.cls is not CORSMiddleware]
    if cors_allow_origins:
        origins = list(cors_allow_origins)
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_credentials="*" not in origins,
            allow_methods=["GET", "POST", "PUT", "DELETE"],
            allow_headers=["Authorization", "Content-Type"],
        )
    app.include_router(admin.router)
    # Ray's app answers validation errors OpenAI-style (400); /admin keeps FastAPI's
    # 422 with the offending field's location, as its OpenAPI schema documents.
    openai_handler = app.exception_handlers[RequestValidationError]

    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        if request.url.path.startswith("/admin"):
            return await request_validation_exception_handler(request, exc)
        return await openai_handler(request, exc)

    app.add_exception_handler(RequestValidationError, validation_error)
    install_body_crash_handlers(app)
    env, path = auth.api_key_env, auth.api_key_file
    # middleware runs last-added first: error answers wrap everything, the body limit
    # guards the rest, then the key, then the body's encoding (only for callers with a key)
    app.add_middleware(JsonBodyGuard)
    app.add_middleware(ApiKeyGuard, key=functools.partial(load_secret, env, path))
    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes)
    app.add_middleware(ErrorResponses)
    return app


def ingress_class(max_body_bytes: int, auth: AuthSection, cors_allow_origins: Sequence[str] = ()) -> type:
    """The Serve ingress class (``@serve.ingress`` applied) with OpenAI and admin routes."""
    app = make_app(max_body_bytes, auth, cors_allow_origins)
    return make_fastapi_ingress(EBPlusIngress, endpoint_map=OPENAI_ENDPOINTS, app=app)
