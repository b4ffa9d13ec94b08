"""The HTTP surface: Ray Serve LLM's OpenAI ingress plus ``/health``, ``/admin/*`` and ``/metrics``.

We keep the ecosystem's ``OpenAiIngress`` (model routing, streaming, OpenAI error
format) and add our routes and guards to the same FastAPI app, so one port
serves everything.
"""

from __future__ import annotations

import functools
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from ray.llm._internal.serve.core.ingress.ingress import DEFAULT_ENDPOINTS, OpenAiIngress, init, make_fastapi_ingress

from deploy import admin
from deploy.admin import AdminService, RayControllerClient
from deploy.auth import load_secret
from deploy.middleware import ApiKeyGuard, BodySizeLimit

# The OpenAI routes of a text-generation deployment (no embeddings/audio/score).
OPENAI_ENDPOINTS = {
    name: DEFAULT_ENDPOINTS[name] for name in ("models", "model_data", "completions", "chat", "tokenize", "detokenize")
}


class EBPlusIngress(OpenAiIngress):
    """``OpenAiIngress`` that also installs the admin service for ``/admin`` and ``/metrics``.

    Args:
        auth: the ``auth:`` section of the config (env/file names, not secrets).
        model_id: served model name (the ``model`` label of the metrics).
    """

    def __init__(
        self,
        llm_deployments: dict[str, Any],
        model_cards: dict[str, Any],
        *,
        auth: dict,
        model_id: str,
        lora_paths: dict[str, str] | None = None,
    ) -> None:
        super().__init__(llm_deployments, model_cards, lora_paths=lora_paths)
        admin_token = load_secret(auth["admin_token_env"], auth.get("admin_token_file"))
        admin.install_service(AdminService(RayControllerClient(), admin_token, model_id))


def make_app(max_body_bytes: int, auth: dict) -> FastAPI:
    """The FastAPI app behind the ingress: Ray's OpenAI app, our routes, our guards.

    Secrets are loaded in the serving process on first use (see ``ApiKeyGuard``),
    never at build time, so they do not travel with the pickled app.
    """
    app = init()
    app.include_router(admin.router)
    # Ray's app answers validation errors OpenAI-style (400); /admin keeps FastAPI's
    # 422 with the offending field's location, as its OpenAPI schema documents.
    openai_handler = app.exception_handlers[RequestValidationError]

    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        if request.url.path.startswith("/admin"):
            return await request_validation_exception_handler(request, exc)
        return await openai_handler(request, exc)

    app.add_exception_handler(RequestValidationError, validation_error)
    env, path = auth["api_key_env"], auth.get("api_key_file")
    # middleware runs last-added first: the body limit guards everything, then the key
    app.add_middleware(ApiKeyGuard, key=functools.partial(load_secret, env, path))
    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes)
    return app


def ingress_class(max_body_bytes: int, auth: dict) -> type:
    """The Serve ingress class (``@serve.ingress`` applied) with OpenAI and admin routes."""
    return make_fastapi_ingress(EBPlusIngress, endpoint_map=OPENAI_ENDPOINTS, app=make_app(max_body_bytes, auth))
