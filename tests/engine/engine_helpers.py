"""Helpers of the engine tier: start in-process vLLM engines, build workloads, run them."""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ebplus.controller.messages import DrainReport, ThresholdUpdate, decode, encode
from ebplus.profiler.local_engine import environment
from ebplus.replicas.settings import SCHEDULER_CLS

#: The tiny engines' shape: a 64-token budget forces chunked prefills of the longer prompts.
TINY_ENGINE = {
    "dtype": "float32",
    "enforce_eager": True,
    "max_model_len": 2048,
    "max_num_batched_tokens": 64,
    "max_num_seqs": 16,
    "enable_prefix_caching": False,
    "seed": 0,
}
#: Under KV pressure: 10 blocks x 128 tokens for up to 16 requests of up to 420 tokens.
TINY_KV_PRESSURE = {**TINY_ENGINE, "max_model_len": 512, "num_gpu_blocks_override": 10}


@contextlib.contextmanager
def engine_env(**env: str) -> Iterator[None]:
    """The tests' engine environment (in-process core, 1 GiB of KV) plus ``env``, restored afterwards."""
    with environment({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", **env}):
        yield


@contextlib.asynccontextmanager
async def async_llm(model: Path, sections: dict[str, Any]) -> AsyncIterator[Any]:
    """The replica's engine: an ``AsyncLLM`` (engine core in its own process) running our scheduler,
    configured by ``sections`` (``additional_config``'s, which win over the ``EBPLUS_*`` environment)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from ebplus.replicas.settings import additional_config

    args = AsyncEngineArgs(
        model=str(model), scheduler_cls=SCHEDULER_CLS, additional_config=additional_config(sections), **TINY_ENGINE
    )
    with engine_env(EBPLUS_MODE="mb", VLLM_ENABLE_V1_MULTIPROCESSING="1"):
        engine = AsyncLLM.from_engine_args(args)
    try:
        yield engine
    finally:
        engine.shutdown()


def make_llm(model: Path, engine: dict, scheduler: bool, **env: str) -> Any:
    from vllm import LLM

    kwargs = dict(engine)
    if scheduler:
        kwargs["scheduler_cls"] = SCHEDULER_CLS
    with engine_env(**env):
        return LLM(model=str(model), **kwargs)


def core_of(llm: Any) -> Any:
    """The in-process ``EngineCore`` of an ``LLM`` (its scheduler is ``.scheduler``)."""
    return llm.llm_engine.engine_core.engine_core


# The scheduler's control channel, through the engine-core utility as a replica calls it.


def applied(llm: Any) -> ThresholdUpdate:
    return decode(core_of(llm).ebplus_call("ebplus_applied"), ThresholdUpdate)


def apply(llm: Any, update: ThresholdUpdate) -> ThresholdUpdate:
    return decode(core_of(llm).ebplus_call("ebplus_apply", [encode(update)]), ThresholdUpdate)


def drain(llm: Any) -> DrainReport:
    return decode(core_of(llm).ebplus_call("ebplus_drain"), DrainReport)


# --------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class Workload:
    """Token-id prompts with greedy sampling: lengths varied, some longer than the token budget."""

    prompts: list
    params: list

    @property
    def prompt_lens(self) -> list[int]:
        return [len(p["prompt_token_ids"]) for p in self.prompts]


def make_workload(n: int = 64, seed: int = 1234) -> Workload:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    rng = random.Random(seed)
    prompts, params = [], []
    for i in range(n):
        plen = rng.choice([5, 17, 40, 63, 64, 65, 100, 150, 257, 300])
        prompts.append(TokensPrompt(prompt_token_ids=[rng.randrange(3, 2000) for _ in range(plen)]))
        extra: dict[str, Any] = {"ignore_eos": i % 4 != 0}
        if i % 8 == 0:  # natural stops: about 2.5% of the vocabulary ends these requests
            extra["stop_token_ids"] = list(range(7, 2000, 40))
        params.append(SamplingParams(temperature=0.0, max_tokens=rng.randint(4, 120), **extra))
    return Workload(prompts, params)


def generate(llm: Any, wl: Workload) -> tuple[list[list[int]], list[str]]:
    outs = llm.generate(wl.prompts, wl.params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs], [o.outputs[0].finish_reason for o in outs]


def warm_up(llm: Any) -> None:
    """One small batch so the first (slow, unreported) steps are behind us, then clear telemetry."""
    generate(llm, make_workload(4, seed=7))
    if llm.llm_engine.vllm_config.scheduler_config.scheduler_cls:
        drain(llm)
