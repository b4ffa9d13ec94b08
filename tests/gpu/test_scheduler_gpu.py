"""The EB+ scheduler on a real GPU (vLLM's CUDA build): the async scheduling path as deployed.

Skipped without ``nvidia-smi`` (see ``tests/conftest.py``). On a GPU vLLM schedules
asynchronously by default; ``EBPlusScheduler`` must then come up as
:class:`~ebplus.replicas.scheduler.EBPlusAsyncScheduler` and give the stock scheduler's
greedy outputs in every mode. GPU kernels are not batch-invariant (EB batches
differ from MB batches), so a near-tie may flip a token even in float32: the test
asks for at least 90% identical sequences, not all.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from ebplus.replicas.settings import SCHEDULER_CLS

pytestmark = pytest.mark.gpu

PROMPTS = [f"Write two sentences about the number {i}." for i in range(24)]
PROMPTS += ["Summarise: " + "exclusive batching separates prefill and decode steps. " * 40]


def _llm(model: str, scheduler: bool, **env: str) -> Any:
    from vllm import LLM

    os.environ.update({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", **env})
    kwargs: dict[str, Any] = {"model": model, "max_model_len": 2048, "max_num_seqs": 16, "gpu_memory_utilization": 0.3}
    if scheduler:
        kwargs["scheduler_cls"] = SCHEDULER_CLS
    return LLM(**kwargs, dtype="float32", enforce_eager=True, max_num_batched_tokens=256, enable_prefix_caching=False)


def test_async_scheduler_on_gpu_matches_stock() -> None:
    from vllm import SamplingParams

    from ebplus.controller.messages import Mode, StepKind, ThresholdUpdate
    from ebplus.deploy import models
    from ebplus.profiler.local_engine import LocalEngineControl
    from ebplus.replicas.scheduler import EBPlusAsyncScheduler

    model = str(models.build_smollm2(models.DEFAULT_CACHE_DIR))
    params = SamplingParams(temperature=0.0, max_tokens=48)
    stock = _llm(model, scheduler=False)
    ref = [o.outputs[0].token_ids for o in stock.generate(PROMPTS, params, use_tqdm=False)]
    del stock
    ours = _llm(model, scheduler=True, EBPLUS_MODE="eb", EBPLUS_K="4")
    core = ours.llm_engine.engine_core.engine_core
    assert type(core.scheduler) is EBPlusAsyncScheduler
    control = LocalEngineControl(core.scheduler)
    assert control.drain().facts.device != "cpu"
    updates = [ThresholdUpdate(mode=Mode.EB, k=4, n=16), ThresholdUpdate(mode=Mode.MB, k=1, n=16),
               ThresholdUpdate(mode=Mode.V0, k=1, n=8)]  # fmt: skip
    for update in updates:
        control.apply(update)
        control.drain()
        got = [o.outputs[0].token_ids for o in ours.generate(PROMPTS, params, use_tqdm=False)]
        same = sum(g == r for g, r in zip(got, ref, strict=True))
        assert same >= 0.9 * len(ref), (update, same)
        drained = control.drain()
        if update.active is Mode.EB:
            assert all(s.kind is not StepKind.MIXED for s in drained.steps)
        assert max(s.running for s in drained.steps) <= update.n
