"""Start-up settings of the EB+ scheduler: the one place that reads ``EBPLUS_*``.

People who run the scheduler in plain vLLM (``--scheduler-cls
replicas.scheduler.EBPlusScheduler``) configure it with environment variables;
our replicas set the same variables from the deployment config
(``deploy.app.engine_env``). The scheduler calls :func:`from_env` once, at
construction; nothing else reads the environment. A bad value fails the engine
start with a message naming the variable.

========================  ==========================================  =========================
variable                  meaning                                     default
========================  ==========================================  =========================
``EBPLUS_MODE``           ``mb`` | ``eb`` | ``v0`` | ``auto``         ``auto`` (runs MB until a
                                                                      controller says EB)
``EBPLUS_N``              cap on concurrently running requests        ``max_num_seqs``
``EBPLUS_K``              EB threshold: prefill once k slots are free ``max(1, floor(0.10 N))``
``EBPLUS_TELEMETRY_BUFFER`` records kept per kind between drains       16384
========================  ==========================================  =========================
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ebplus.controller import theory
from ebplus.controller.planner import PlannerConfig
from ebplus.replicas.phases import Mode, ThresholdUpdate

ENV_MODE = "EBPLUS_MODE"
ENV_K = "EBPLUS_K"
ENV_N = "EBPLUS_N"
ENV_TELEMETRY_BUFFER = "EBPLUS_TELEMETRY_BUFFER"

DEFAULT_TELEMETRY_BUFFER = 16384
#: k before any controller decision: the planner's cold-start theta times N.
THETA_COLD: float = PlannerConfig.model_fields["theta_cold"].default


class SettingsError(ValueError):
    """An ``EBPLUS_*`` variable with an unusable value; the message names it."""


@dataclass(frozen=True)
class SchedulerSettings:
    """What the scheduler starts with.

    Attributes:
        thresholds: the initial mode, k and N (version 0).
        telemetry_buffer: records kept per kind (steps, completions) between two
            drains; beyond it the oldest are dropped and counted.
    """

    thresholds: ThresholdUpdate
    telemetry_buffer: int = DEFAULT_TELEMETRY_BUFFER


def default_k(n: int) -> int:
    """``max(1, floor(theta_cold * n))``: the planner's threshold before any estimate."""
    return theory.k_star(THETA_COLD, n)


def _int(env: Mapping[str, str], name: str, lo: int, hi: int | None = None) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not an integer") from None
    if value < lo or (hi is not None and value > hi):
        bound = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise SettingsError(f"{name}={value} must be {bound}")
    return value


def from_env(max_num_seqs: int, env: Mapping[str, str] | None = None) -> SchedulerSettings:
    """Read and validate ``EBPLUS_*`` (``env`` defaults to ``os.environ``).

    ``max_num_seqs`` is the engine's start-up cap: vLLM sizes its buffers from it,
    so ``EBPLUS_N`` may only lower it.

    Raises:
        SettingsError: a variable is malformed or out of range.
    """
    env = os.environ if env is None else env
    raw_mode = env.get(ENV_MODE, "").strip().lower() or Mode.AUTO.value
    try:
        mode = Mode(raw_mode)
    except ValueError:
        choices = "|".join(m.value for m in Mode)
        raise SettingsError(f"{ENV_MODE}={env.get(ENV_MODE)!r} must be one of {choices}") from None
    n = _int(env, ENV_N, 1, max_num_seqs)
    n = max_num_seqs if n is None else n
    k = _int(env, ENV_K, 1, n)
    k = default_k(n) if k is None else k
    buffer = _int(env, ENV_TELEMETRY_BUFFER, 1)
    # AUTO starts in MB: the controller switches it to EB when EB wins.
    active = Mode.MB if mode in (Mode.MB, Mode.AUTO) else Mode.EB
    return SchedulerSettings(
        thresholds=ThresholdUpdate(mode=mode, k=k, n=n, version=0, active=active),
        telemetry_buffer=DEFAULT_TELEMETRY_BUFFER if buffer is None else buffer,
    )
