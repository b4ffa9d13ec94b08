"""ASGI middlewares in front of the whole HTTP surface.

Pure ASGI (no Starlette BaseHTTPMiddleware) so streaming responses pass
through untouched. In request order (``deploy.ingress.make_app`` installs them):

1. :class:`ErrorResponses` - back-pressure answers (429/503) carry ``Retry-After``;
   other 5xx bodies are replaced by a generic error (the stock ones carry a Ray
   traceback: paths, pids, actor ids).
2. :class:`BodySizeLimit` - 413 before a large body is buffered.
3. :class:`ApiKeyGuard` - 401 on ``/v1`` without the API key.
4. :class:`JsonBodyGuard` - a request body must be JSON in UTF-8 without lone
   surrogates or non-finite numbers; otherwise 415/400 (422 on ``/admin``) with the
   reason, instead of a 500 from deep inside the stack. It can also run a check of
   the parsed body (the plain-vLLM plugin's output budget).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Awaitable, Callable

from ebplus.deploy.auth import Secret, bearer_token

ASGIApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]


async def _send_body(send, status: int, body: bytes, headers: list | None = None) -> None:
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


async def _send_json(send, status: int, message: str, kind: str, headers: list | None = None) -> None:
    """An OpenAI-style error answer."""
    body = json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()
    await _send_body(send, status, body, headers)


class BodySizeLimit:
    """Refuse request bodies larger than ``max_bytes`` with 413, before they are buffered.

    ``max_bytes`` may be a zero-argument callable, read per request: the plain-vLLM
    plugin installs this before its settings are read.
    """

    def __init__(self, app: ASGIApp, max_bytes: int | Callable[[], int]) -> None:
        self.app = app
        self._max_bytes = max_bytes

    @property
    def max_bytes(self) -> int:
        limit = self._max_bytes
        return limit() if callable(limit) else limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        max_bytes = self.max_bytes
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > max_bytes:
                await _send_json(send, 413, f"request body exceeds {max_bytes} bytes", "payload_too_large")
                return
        seen = 0
        started = False

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > max_bytes:
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
            await _send_json(send, 413, f"request body exceeds {max_bytes} bytes", "payload_too_large")


class _TooLarge(Exception):
    pass


#: The model's routes: the OpenAI API and vLLM's tokenizer routes (they run the model's tokenizer too).
MODEL_ROUTES = ("/v1", "/tokenize", "/detokenize")


class ApiKeyGuard:
    """Require ``Authorization: Bearer <api key>`` on the model's routes when an API key is configured.

    ``key`` is a :class:`Secret` or a zero-argument loader called on first use,
    so the key is read in the serving process (from its environment or secret
    file) instead of travelling inside the pickled application.
    """

    def __init__(
        self, app: ASGIApp, key: Secret | Callable[[], Secret], prefix: str | tuple[str, ...] = MODEL_ROUTES
    ) -> None:
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


#: Seconds a client should wait after a back-pressure rejection (a replica frees a
#: slot within a few decode steps; the OpenAI client honours the header).
RETRY_AFTER_S = 1

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class _BadBody(ValueError):
    pass


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _BadBody(f"number {text[:40]} is out of range")
    return value


def _no_constant(name: str) -> float:
    raise _BadBody(f"{name} is not a JSON number")


def _check_strings(value: object) -> None:
    """Raise if a parsed JSON value holds a string that is not valid Unicode (a lone surrogate)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                raise _BadBody("a string holds a lone UTF-16 surrogate (\\ud800-\\udfff)") from None
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


#: What :func:`parse_body` answers for a body that is not JSON at all (the application's to refuse).
NOT_JSON = object()

#: A check of a parsed JSON body by route: ``(path, body) -> reason`` of a 400, or ``None``.
BodyCheck = Callable[[str, object], str | None]


def parse_body(body: bytes, content_type: str | None) -> tuple[tuple[int, str] | None, object]:
    """``(problem, parsed)``: why a request body cannot be served as JSON (``(status, reason)``,
    or ``None`` if it can), and its value (:data:`NOT_JSON` when it is not JSON).

    Syntax errors are left to the application (it answers them in its own format).
    """
    if not body:
        return None, NOT_JSON
    # No type, or an empty one, is refused too: vLLM's routes refuse it with a validation error its handler
    # cannot serialise (a 500 on the live deployment, found by the hostile campaign)
    mime = (content_type or "").split(";")[0].strip().lower()
    if mime != "application/json" and not mime.endswith("+json"):
        return (415, f"request body must be application/json, got {mime or 'no type'}"), NOT_JSON
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return (400, f"request body is not valid UTF-8 (byte {exc.start})"), NOT_JSON
    try:
        parsed = json.loads(text, parse_float=_finite_float, parse_constant=_no_constant)
        if _SURROGATE_ESCAPE.search(body):
            _check_strings(parsed)
    except _BadBody as exc:
        return (400, f"request body: {exc}"), NOT_JSON
    except (ValueError, RecursionError):
        return None, NOT_JSON  # not JSON at all: the application says so in its own format
    return None, parsed


class JsonBodyGuard:
    """Refuse request bodies the JSON stack below would choke on (500s otherwise).

    Seen on the live deployment before this guard: a lone surrogate (``"\\ud800"``)
    in a prompt failed tokenisation in the replica; a form or ``text/plain`` body
    made the validation-error handler fail on ``bytes``; ``1e400`` parsed to
    infinity that the error handler could not serialise. Bodies are already
    bounded by :class:`BodySizeLimit`, so buffering one here is cheap.
    """

    def __init__(self, app: ASGIApp, check: BodyCheck | None = None, paths: tuple[str, ...] = ("/",)) -> None:
        self.app = app
        self.check = check
        self.paths = paths  # path prefixes guarded (others pass untouched: a form upload, say)

    async def __call__(self, scope, receive, send) -> None:
        if (
            scope["type"] != "http"
            or scope.get("method") not in _BODY_METHODS
            or not scope.get("path", "").startswith(self.paths)
        ):
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # client went away
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        content_type = next((v.decode("latin-1") for k, v in scope.get("headers", []) if k == b"content-type"), None)
        problem, parsed = parse_body(body, content_type)
        if problem is None and self.check is not None and parsed is not NOT_JSON:
            reason = self.check(scope.get("path", ""), parsed)
            problem = None if reason is None else (400, reason)
        if problem is not None:
            status, reason = problem
            if scope.get("path", "").startswith("/admin"):
                detail = {"detail": [{"loc": ["body"], "msg": reason, "type": "value_error"}]}
                await _send_body(send, 422 if status == 400 else status, json.dumps(detail).encode())
            else:
                await _send_json(send, status, reason, "invalid_request_error")
            return
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class ErrorResponses:
    """Error answers a client can act on, without the server's internals.

    * 429 and 503 get ``Retry-After`` when they lack one: Ray Serve rejects a
      request over ``max_queued_requests`` with a bare 503 (plain text), which
      becomes an OpenAI-style JSON error with the same message.
    * Any other 5xx body is replaced by a generic message with the request id:
      the stock body is a Ray traceback (file paths, pids, actor ids). The
      original stays in the replica's log under the same request id.

    Streaming responses start with 200 and pass through untouched.
    """

    def __init__(self, app: ASGIApp, retry_after_s: int = RETRY_AFTER_S) -> None:
        self.app = app
        self.retry_after = str(retry_after_s).encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        held: dict | None = None
        parts: list[bytes] = []

        async def filtering_send(message):
            nonlocal held
            if message["type"] == "http.response.start" and (message["status"] >= 500 or message["status"] == 429):
                held = message
                return
            if held is not None and message["type"] == "http.response.body":
                parts.append(message.get("body", b""))
                if not message.get("more_body", False):
                    await self._send_error(send, held, b"".join(parts))
                return
            await send(message)

        await self.app(scope, receive, filtering_send)

    async def _send_error(self, send, start: dict, body: bytes) -> None:
        status = start["status"]
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() not in (b"content-length", b"content-type")]
        names = {k.lower() for k, _ in headers}
        request_id = next((v.decode("latin-1") for k, v in headers if k.lower() == b"x-request-id"), None)
        if status in (429, 503):
            if b"retry-after" not in names:
                headers.append((b"retry-after", self.retry_after))
            content_type = next((v for k, v in start.get("headers", []) if k.lower() == b"content-type"), b"")
            if content_type.startswith(b"application/json"):
                new_body = body
            else:  # Serve's back-pressure text
                message = body.decode("utf-8", "replace")[:500] or "service unavailable"
                kind = "rate_limit_error" if status == 429 else "service_unavailable"
                new_body = json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()
        else:
            suffix = f" (request id {request_id})" if request_id else ""
            message = f"internal error{suffix}; the server log has the details"
            new_body = json.dumps({"error": {"message": message, "type": "internal_error", "code": status}}).encode()
        await _send_body(send, status, new_body, headers)
