"""``ebplus status``: what a running deployment is doing, read over its HTTP API.

It asks ``/health``, ``/v1/models``, ``/admin/thresholds`` and ``/admin/estimates`` of
a deployment (local ``ebplus serve`` or the chart's Service) and prints one table:
per replica the mode, the active policy, k, N, theta0/theta*, and the published and
applied threshold versions; for the fleet p0, eta, mu_L and mu_O. The chart's
``helm test`` pod runs it too, so a green ``helm test`` means exactly what this
command checks.

Credentials come from the environment, never from the command line (which other
users can read in ``ps``): the admin token from ``EBPLUS_ADMIN_TOKEN`` and the /v1
API key from ``EBPLUS_API_KEY`` (other names: ``--token-env``, ``--api-key-env``).

Exit status: 0 all answered and the controller is up; 1 the deployment answered but
is degraded (controller away, a check of ``--expect-model`` failed); 2 it could not be
asked (unreachable, credentials refused): one line on stderr, no traceback.

Standard library only: the command works in an install without Ray or vLLM.
"""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ebplus.errors import CommandError

DEFAULT_URL = "http://127.0.0.1:8000"

#: ``fetch(path, headers) -> (status, parsed JSON or text)``; injectable for tests.
Fetch = Callable[[str, dict[str, str]], tuple[int, Any]]


def http_fetch(base_url: str, timeout_s: float) -> Fetch:
    """GET ``base_url + path`` with urllib; connection failures become a :class:`CommandError`."""

    def fetch(path: str, headers: dict[str, str]) -> tuple[int, Any]:
        url = base_url.rstrip("/") + path
        request = urllib.request.Request(url, headers={"Accept": "application/json", **headers})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CommandError(
                f"cannot reach {url}: {reason} (is the deployment running? `ebplus serve` prints its URL)"
            ) from None
        except ValueError as exc:  # a malformed URL
            raise CommandError(f"--url {base_url!r}: {exc}") from None
        text = raw.decode("utf-8", "replace")
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    return fetch


@dataclass
class Status:
    """What the deployment answered."""

    url: str
    health: dict[str, Any]
    models: list[str]
    thresholds: dict[str, Any] | None = None
    estimates: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def degraded(self) -> bool:
        return bool(self.problems)

    def as_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "health": self.health,
            "models": self.models,
            "thresholds": self.thresholds,
            "estimates": self.estimates,
            "problems": self.problems,
        }


def _detail(body: Any) -> str:
    if isinstance(body, dict):
        detail = body.get("detail") or (body.get("error") or {}).get("message")
        if detail:
            return str(detail)
    return str(body)[:200]


def collect(
    fetch: Fetch, url: str, admin_token: str | None, api_key: str | None, expect_model: str | None = None
) -> Status:
    """Ask the four endpoints; refused credentials raise :class:`CommandError`, the rest is reported."""
    code, health = fetch("/health", {})
    if code != 200 or not isinstance(health, dict):
        raise CommandError(f"{url}/health answered {code}: {_detail(health)} (is this an EB+ Serve endpoint?)")
    status = Status(url=url, health=health, models=[])
    if not health.get("controller"):
        status.problems.append("the controller does not answer: thresholds are frozen at their last values")

    code, models = fetch("/v1/models", {"Authorization": f"Bearer {api_key}"} if api_key else {})
    if code == 401:
        raise CommandError(
            f"{url}/v1/models needs an API key: {'it refused the one given' if api_key else 'none given'} "
            "(set EBPLUS_API_KEY, or the variable named by --api-key-env)"
        )
    if code == 200 and isinstance(models, dict):
        status.models = sorted(str(m.get("id")) for m in models.get("data", []) if isinstance(m, dict))
    else:
        status.problems.append(f"/v1/models answered {code}: {_detail(models)}")
    if expect_model is not None and expect_model not in status.models:
        status.problems.append(f"model {expect_model!r} is not served (served: {', '.join(status.models) or 'none'})")

    headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
    for path in ("/admin/thresholds", "/admin/estimates"):
        code, body = fetch(path, headers)
        if code in (401, 403):
            raise CommandError(
                f"{url}{path}: {'the admin token was refused' if admin_token else 'an admin token is required'} "
                "(set EBPLUS_ADMIN_TOKEN, or the variable named by --token-env, to the deployment's token)"
            )
        if code != 200 or not isinstance(body, dict):
            status.problems.append(f"{path} answered {code}: {_detail(body)}")
            continue
        if path == "/admin/thresholds":
            status.thresholds = body
        else:
            status.estimates = body
    return status


# -- the table --------------------------------------------------------------------------


def _num(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, (int, float)):
        return format(value, fmt)
    return str(value)


def table(headers: list[str], rows: list[list[str]]) -> str:
    """Left-aligned text columns, two spaces apart."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = [headers, *rows]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines)


REPLICA_COLUMNS = ["replica", "mode", "active", "k", "N", "theta0", "theta*", "version", "applied", "device"]


def replica_rows(thresholds: dict[str, Any]) -> list[list[str]]:
    rows = []
    for rid, r in sorted(thresholds.get("replicas", {}).items()):
        applied = r.get("applied_version")
        rows.append([
            rid,
            str(r.get("mode", "-")),
            str(r.get("active", "-")),
            _num(r.get("k"), "d"),
            _num(r.get("n"), "d"),
            _num(r.get("theta0"), ".3f"),
            _num(r.get("theta_star"), ".3f"),
            _num(r.get("version"), "d"),
            "none yet" if applied == -1 else _num(applied, "d"),
            str(r.get("device") or "-"),
        ])  # fmt: skip
    return rows


def render(status: Status) -> str:
    """The human-readable report."""
    health = status.health
    controller = f"controller up (version {health.get('version')})" if health.get("controller") else "controller DOWN"
    out = [f"EB+ Serve at {status.url}: {health.get('status', '?')}, {controller}"]
    out.append(f"models: {', '.join(status.models) or '-'}")
    if status.thresholds is not None:
        rows = replica_rows(status.thresholds)
        out += ["", table(REPLICA_COLUMNS, rows) if rows else "no replicas have registered with the controller yet"]
        overrides = status.thresholds.get("overrides") or {}
        for key, ov in sorted(overrides.items()):
            pinned = ", ".join(f"{k}={v}" for k, v in ov.items() if k in ("mode", "k", "n") and v is not None)
            out.append(f"override {key}: {pinned or '-'}")
    if status.estimates is not None:
        fleet = status.estimates.get("fleet") or {}
        est = fleet.get("estimate") or {}  # null before the first estimate
        out += [
            "",
            "fleet:  p0 {}  eta {}  mu_L {}  mu_O {}   ({} samples, {} updates, {} completions)".format(
                _num(est.get("p0"), ".3g"),
                _num(est.get("eta"), ".3g"),
                _num(est.get("mu_l"), ".1f"),
                _num(est.get("mu_o"), ".1f"),
                _num(est.get("n_samples"), "d"),
                _num(fleet.get("updates"), "d"),
                _num(fleet.get("completions"), "d"),
            ),
        ]
    out += [f"problem: {p}" for p in status.problems]
    return "\n".join(out)


# -- the command ------------------------------------------------------------------------


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser(
        "status",
        help="show a running deployment's thresholds and estimates",
        description=" ".join(__doc__.split("\n\n")[1].replace("``", "").split()),
    )
    s.add_argument("--url", default=DEFAULT_URL, help=f"the deployment's HTTP address (default {DEFAULT_URL})")
    s.add_argument("--token-env", default="EBPLUS_ADMIN_TOKEN", metavar="NAME", help="env var holding the admin token")
    s.add_argument("--api-key-env", default="EBPLUS_API_KEY", metavar="NAME", help="env var holding the /v1 API key")
    s.add_argument("--expect-model", metavar="ID", help="fail (exit 1) unless /v1/models lists this model")
    s.add_argument("--timeout", type=float, default=10.0, help="seconds per request (default 10)")
    s.add_argument("--json", action="store_true", help="print the answers as JSON")
    s.set_defaults(run=run_status)


def run_status(args: argparse.Namespace, fetch: Fetch | None = None) -> int:
    if not args.url.startswith(("http://", "https://")):
        raise CommandError(f"--url must start with http:// or https://, got {args.url!r}")
    token = os.environ.get(args.token_env, "").strip() or None
    api_key = os.environ.get(args.api_key_env, "").strip() or None
    status = collect(fetch or http_fetch(args.url, args.timeout), args.url, token, api_key, args.expect_model)
    print(json.dumps(status.as_json(), indent=2) if args.json else render(status))
    return 1 if status.degraded else 0
