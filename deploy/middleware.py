"""ASGI middlewares in front of the whole HTTP surface.

Pure ASGI (no Starlette BaseHTTPMiddleware) so streaming responses pass
through untouched.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from deploy.auth import Secret, bearer_token

ASGIApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]


async def _send_json(send, status: int, message: str, kind: str, headers: list | None = None) -> None:
    body = json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodySizeLimit:
    """Refuse request bodies larger than ``max_bytes`` with 413, before they are buffered."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await _send_json(send, 413, f"request body exceeds {self.max_bytes} bytes", "payload_too_large")
                return
        seen = 0
        started = False

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return message

        async def tracking_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if started:  # too late for a clean 413: the response is already under way
                raise
            await _send_json(send, 413, f"request body exceeds {self.max_bytes} bytes", "payload_too_large")


class _TooLarge(Exception):
    pass


class ApiKeyGuard:
    """Require ``Authorization: Bearer <api key>`` on ``/v1`` when an API key is configured.

    ``key`` is a :class:`Secret` or a zero-argument loader called on first use,
    so the key is read in the serving process (from its environment or secret
    file) instead of travelling inside the pickled application.
    """

    def __init__(self, app: ASGIApp, key: Secret | Callable[[], Secret], prefix: str = "/v1") -> None:
        self.app = app
        self._key = key
        self.prefix = prefix

    @property
    def key(self) -> Secret:
        if not isinstance(self._key, Secret):
            self._key = self._key()
        return self._key

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope.get("path", "").startswith(self.prefix) and self.key.configured:
            header = next((v.decode("latin-1") for k, v in scope.get("headers", []) if k == b"authorization"), None)
            if not self.key.matches(bearer_token(header)):
                await _send_json(
                    send, 401, "missing or invalid API key", "authentication_error", [(b"www-authenticate", b"Bearer")]
                )
                return
        await self.app(scope, receive, send)
