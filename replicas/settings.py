"""Start-up settings of the EB+ scheduler: the one place they are read.

The scheduler runs inside vLLM's engine core and is configured when vLLM
constructs it. Its primary source is vLLM's own ``--additional-config`` (engine
argument ``additional_config``), whose ``ebplus`` object carries the deployment
config's sections::

    --additional-config '{"ebplus": {"scheduler": {"mode": "auto"}, "controller": {...}}}'

``scheduler`` is validated by :class:`~ebplus.replicas.config.SchedulerSection`,
``controller`` by :class:`~ebplus.controller.config.ControllerConfig` (the
scheduler takes the cold threshold ``planner.theta_cold`` from it). ``auth`` and
``replicas`` belong to the API-server side: the plain-vLLM plugin
(:mod:`ebplus.deploy.vllm_plugin`) reads the whole object with :func:`read`, every
key checked. Our Ray Serve replicas pass their config this way too.

Fallback, for ``vllm serve --scheduler-cls ...`` without ``--additional-config``:
environment variables, read here and nowhere else, validated by the same models.

==========================  ==========================================  =========================
variable                    meaning                                     default
==========================  ==========================================  =========================
``EBPLUS_MODE``             ``mb`` | ``eb`` | ``v0`` | ``auto`` |        ``auto`` (runs MB until a
                            ``shadow``                                  controller says EB)
``EBPLUS_N``                cap on concurrently running requests        ``max_num_seqs``
``EBPLUS_K``                EB threshold: prefill once k slots are free ``theta_cold x N``
``EBPLUS_TELEMETRY_BUFFER`` records kept per kind between drains        16384
==========================  ==========================================  =========================

A bad value fails the engine start with a message naming the key or variable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ebplus import keys
from ebplus.controller.config import ControllerConfig
from ebplus.replicas.config import SchedulerSection

#: The key of vLLM's ``additional_config`` that holds our settings.
ADDITIONAL_CONFIG_KEY = "ebplus"
#: The dotted class name for vLLM's ``scheduler_cls`` (``--scheduler-cls``).
SCHEDULER_CLS = "ebplus.replicas.scheduler.EBPlusScheduler"

ENV = {"mode": "EBPLUS_MODE", "k": "EBPLUS_K", "n": "EBPLUS_N", "telemetry_buffer": "EBPLUS_TELEMETRY_BUFFER"}


class SettingsError(ValueError):
    """Unusable scheduler settings; the message names the key or variable."""


class EngineSettings(BaseModel):
    """The part of the ``ebplus`` object the engine-core side reads."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    scheduler: SchedulerSection = Field(default_factory=SchedulerSection)
    controller: ControllerConfig = Field(default_factory=ControllerConfig)
    source: str = Field("defaults", exclude=True, description="Where the settings came from (for messages).")

    @property
    def theta_cold(self) -> float:
        return self.controller.planner.theta_cold


S = TypeVar("S", bound=EngineSettings)


def additional_config(sections: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's ``additional_config`` value carrying ``sections`` (their JSON form) under our key."""
    return {ADDITIONAL_CONFIG_KEY: {name: _json(value) for name, value in sections.items()}}


def _json(value: Any) -> Any:
    return value.model_dump(mode="json", exclude_unset=True) if isinstance(value, BaseModel) else value


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    section: dict[str, Any] = {}
    for field, var in ENV.items():
        raw = env.get(var, "").strip()
        if raw:
            section[field] = raw.lower() if field == "mode" else raw
    return {"scheduler": section}


def load(additional: Any = None, env: Mapping[str, str] | None = None) -> EngineSettings:
    """The scheduler's settings: ``additional_config["ebplus"]`` if given, else ``EBPLUS_*`` (``env``
    defaults to ``os.environ``), else defaults.

    Raises:
        SettingsError: a value is malformed or out of range (the key or variable is named).
    """
    return read(EngineSettings, additional, env)


def read(model: type[S], additional: Any = None, env: Mapping[str, str] | None = None) -> S:
    """The ``ebplus`` object of ``additional`` (else ``EBPLUS_*``, else defaults) validated by ``model``.

    :func:`load` reads the engine-core side with :class:`EngineSettings`; the plain-vLLM
    plugin reads the API-server side with its subclass, from the same object, so both
    sides find the same values and report a bad one the same way.

    Raises:
        SettingsError: a value is malformed or out of range (the key or variable is named).
    """
    env = os.environ if env is None else env
    ours = additional.get(ADDITIONAL_CONFIG_KEY) if isinstance(additional, Mapping) else None
    if ours is not None:
        if not isinstance(ours, Mapping):
            raise SettingsError(f"additional_config.{ADDITIONAL_CONFIG_KEY} must be an object, got {ours!r}")
        data, source = dict(ours), "additional_config"
    else:
        data, source = _from_env(env), "environment"
    try:
        return model.model_validate({**data, "source": source})
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = tuple(str(p) for p in first["loc"])
        if source == "environment" and len(loc) == 2 and loc[1] in ENV:
            where = f"{ENV[loc[1]]}={env.get(ENV[loc[1]])!r}"
        else:
            where = f"additional_config.{ADDITIONAL_CONFIG_KEY}." + ".".join(loc)
        msg = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            msg = keys.unknown_key(model, loc)
        raise SettingsError(f"{where}: {msg}") from None
