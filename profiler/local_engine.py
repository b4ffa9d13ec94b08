"""An in-process vLLM engine built from a deployment config, for ``ebplus profile`` and the engine benchmark.

The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so a
driver can run it one step at a time (``llm.llm_engine.step()``) and reach the
EB+ scheduler directly (:func:`scheduler_of`). The engine arguments are the
deployment's own (``ebplus.replicas.config.EngineSection``), so a profile is measured on
the engine that serves.

vLLM reads its environment when the engine starts (and caches it afterwards):
:func:`start_llm` sets the variables, drops vLLM's cache, starts the engine and
restores the previous values.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator
from typing import Any

from ebplus.controller.messages import DrainReport, Mode, ThresholdUpdate, decode, encode
from ebplus.deploy.config import ServeConfig
from ebplus.replicas.control import drained


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """``env`` set for one engine start, restored afterwards.

    vLLM caches its environment variables once an engine core is up
    (``enable_envs_cache``); the cache is dropped first so this engine reads ``env``.
    """
    import vllm.envs

    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    vllm.envs.disable_envs_cache()
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def start_llm(
    cfg: ServeConfig,
    model_path: str,
    *,
    scheduler: bool = True,
    mode: Mode = Mode.MB,
    extra_engine_args: dict[str, Any] | None = None,
) -> Any:
    """A ``vllm.LLM`` with the deployment's engine arguments, in this process.

    Args:
        scheduler: run the EB+ scheduler (else vLLM's stock scheduler), with the
            config's scheduler settings but in ``mode``; thresholds change later
            through :func:`scheduler_of` (``ebplus_apply``).
        extra_engine_args: overrides of the config's engine arguments.
    """
    from vllm import LLM

    from ebplus.deploy.app import engine_env, engine_kwargs

    if scheduler:
        cfg = cfg.model_copy(update={"scheduler": cfg.scheduler.model_copy(update={"mode": mode})})
        kwargs = engine_kwargs(cfg)
    else:
        kwargs = cfg.engine.engine_kwargs()
    with environment({**engine_env(cfg), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}):
        return LLM(model=model_path, **{**kwargs, **(extra_engine_args or {})})


def scheduler_of(llm: Any) -> Any:
    """The EB+ scheduler of an in-process engine (``ebplus_apply``/``ebplus_drain``...)."""
    return llm.llm_engine.engine_core.engine_core.scheduler


def random_prompt(rng: random.Random, length: int, vocab_size: int) -> dict:
    """A token-id prompt of exactly ``length`` tokens (ids away from the special tokens at both ends)."""
    from vllm.inputs import TokensPrompt

    lo, hi = min(100, vocab_size // 4), max(vocab_size - 100, vocab_size * 3 // 4)
    return TokensPrompt(prompt_token_ids=[rng.randrange(lo, hi) for _ in range(length)])


def vocab_size(llm: Any) -> int:
    return int(llm.llm_engine.model_config.get_vocab_size())


class LocalEngineControl:
    """The same calls on a scheduler in this process (``vllm.LLM`` with the engine core in-process)."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def apply(self, update: ThresholdUpdate) -> ThresholdUpdate:
        return decode(self.scheduler.ebplus_apply(encode(update)), ThresholdUpdate)

    def applied(self) -> ThresholdUpdate:
        return decode(self.scheduler.ebplus_applied(), ThresholdUpdate)

    def drain(self) -> DrainReport:
        return drained(self.scheduler.ebplus_drain())
