"""A real vLLM scheduler (stock or EB+) on a synthetic KV cache, stepped without a model.

vLLM tests its scheduler this way (``tests/v1/core/utils.py``): a ``Scheduler`` built
from a hand-made ``KVCacheConfig`` and a model ``config.json``, each step a
``schedule()`` followed by ``update_from_output()`` with the tokens a model would have
sampled. No weights, no tokenizer, no engine process: a step costs well under a
millisecond. This one writes its own one-layer Llama ``config.json``. (The first use on a
machine costs vLLM's one-off inspection of the architecture in a subprocess, cached under
``VLLM_CACHE_ROOT``.)

Everything that depends on the vLLM release lives here (the config and constructor
arguments, the fields of ``SchedulerOutput`` and ``ModelRunnerOutput``, how a request is
held back, where its KV blocks are counted), written for vLLM 0.29 and unchanged through
0.32, so the tests read only behaviour: which requests a step gave tokens to, which it
admitted and preempted, what runs after it, and what the EB+ scheduler reports over its
control channel. Where vLLM keeps what the tests read back (skipped requests) comes from
:mod:`ebplus.replicas.compat`, as the scheduler reads it.
"""

from __future__ import annotations

import dataclasses
import json
from collections import deque
from pathlib import Path
from typing import Any

import torch
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from ebplus.controller.messages import StepKind
from ebplus.profiler.local_engine import LocalEngineControl
from ebplus.replicas import compat, settings
from ebplus.replicas.scheduler import EBPlusScheduler

#: Tokens per KV block.
BLOCK = 16
#: The token every request samples, and the one that stops a request that asks for it.
TOKEN, STOP_TOKEN = 1, 2

#: A one-layer Llama: enough for vLLM to resolve the architecture and the model length.
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "num_hidden_layers": 1,
    "vocab_size": 256,
    "max_position_embeddings": 1024,
    "torch_dtype": "float32",
}


def write_model(directory: Path) -> Path:
    """A model directory holding only ``config.json`` (vLLM reads nothing else without weights)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(MODEL_CONFIG))
    return directory


def make_scheduler(
    model: Path,
    scheduler_cls: type[Scheduler] = EBPlusScheduler,
    *,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 64,
    num_blocks: int = 1000,
    max_model_len: int = 512,
    async_scheduling: bool = False,
    **ebplus: Any,
) -> Scheduler:
    """A scheduler as vLLM's engine core builds it, on ``num_blocks`` KV blocks of :data:`BLOCK` tokens.

    ``ebplus``: the ``scheduler`` section of our settings (``mode``, ``k``, ``n``...), passed
    through vLLM's ``additional_config`` as a deployment does (so ``EBPLUS_*`` in the
    environment cannot leak in). Prefix caching is off: every prompt is computed, so
    token counts are exact.
    """
    vllm_config = VllmConfig(
        model_config=ModelConfig(
            model=str(model), skip_tokenizer_init=True, dtype="float32", max_model_len=max_model_len
        ),
        scheduler_config=SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            enable_chunked_prefill=True,
            is_encoder_decoder=False,
        ),
        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=False),
        additional_config=settings.additional_config({"scheduler": ebplus}),
    )
    # vLLM turns async scheduling off on CPU; the scheduler only reads the flag
    vllm_config.scheduler_config.async_scheduling = async_scheduling
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)]
    )
    return scheduler_cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=BLOCK,
        log_stats=True,
    )


@dataclasses.dataclass(frozen=True)
class Step:
    """What one step did, read from the scheduler's output and the requests.

    Attributes:
        prefill: prompt tokens (or a preempted request's recompute) per request.
        decode: decode tokens per request.
        context: the tokens the decodes had computed before the step (the KV they read).
        admitted: requests that started (new) or resumed (after a preemption) in this step.
        preempted: requests the step sent back to waiting.
        running: requests holding a slot once the step was scheduled (before its tokens came
            back, as the telemetry counts them), in the scheduler's order.
        waiting: requests queued at the same moment.
        finished: requests that left the engine when the step's output came back.
    """

    prefill: dict[str, int]
    decode: dict[str, int]
    context: int
    admitted: tuple[str, ...]
    preempted: tuple[str, ...]
    running: tuple[str, ...]
    waiting: int
    finished: tuple[str, ...]

    @property
    def kind(self) -> StepKind:
        return StepKind.of(sum(self.prefill.values()), sum(self.decode.values()))


class Driver:
    """Feeds requests to a scheduler and runs its steps as the engine core would, without a model."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        #: the EB+ control channel, bytes in and out as over the engine-core utility
        self.control = LocalEngineControl(scheduler)
        self.requests: dict[str, Request] = {}
        self._stop_at: dict[str, int] = {}

    # -- requests ---------------------------------------------------------

    def add(
        self, prompt_len: int, max_tokens: int = 8, count: int = 1, stop_after: int | None = None, held: bool = False
    ) -> list[str]:
        """Queue ``count`` requests; ``stop_after``: sample the stop token as that output token (1-based).

        ``held``: vLLM holds the request back for something outside the scheduler (here a
        structured-output grammar that never compiles): it waits, but cannot be admitted.
        """
        ids = []
        for _ in range(count):
            rid = f"r{len(self.requests)}"
            params = SamplingParams(max_tokens=max_tokens, stop_token_ids=[STOP_TOKEN], ignore_eos=True)
            # distinct prompts: no two requests share a prefix
            prompt = [3 + len(self.requests) % 200] * prompt_len
            request = Request(request_id=rid, prompt_token_ids=prompt, sampling_params=params, pooling_params=None)
            if held:
                request.status = _HELD
            self.requests[rid] = request
            if stop_after is not None:
                self._stop_at[rid] = stop_after
            self.scheduler.add_request(request)
            ids.append(rid)
        return ids

    def release(self, rid: str) -> None:
        """Lift a ``held`` request's hold, as vLLM does itself once the grammar compiled: it waits as usual."""
        self.requests[rid].status = RequestStatus.WAITING

    def skipped(self) -> tuple[str, ...]:
        """Waiting requests vLLM passed over (or that arrived held), wherever this release keeps them."""
        return tuple(sorted(r.request_id for r in compat.scheduler_layout().skipped_requests(self.scheduler)))

    def abort(self, *ids: str) -> None:
        """Abort requests from outside the scheduler, as the API server does when a client leaves."""
        self.scheduler.finish_requests(list(ids), RequestStatus.FINISHED_ABORTED)

    def output_len(self, rid: str) -> int:
        return len(self.requests[rid].output_token_ids)

    def prompt_done(self, rid: str) -> bool:
        """Whether ``rid``'s prompt is computed (it decodes next; after a preemption it is not)."""
        req = self.requests[rid]
        return req.num_computed_tokens >= req.num_prompt_tokens

    def blocks(self, rid: str) -> int:
        """KV blocks ``rid`` holds now."""
        return sum(len(group) for group in self.scheduler.kv_cache_manager.get_block_ids(rid))

    def free_blocks(self) -> int:
        return self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()

    # -- steps ------------------------------------------------------------

    def running(self) -> tuple[str, ...]:
        return tuple(r.request_id for r in self.scheduler.running)

    def waiting(self) -> int:
        return self.scheduler.get_request_counts()[1]

    def step(self) -> Step:
        """One ``schedule()``, then ``update_from_output()`` with a token for every request whose prompt is done."""
        computed = {rid: r.num_computed_tokens for rid, r in self.requests.items()}
        out = self.scheduler.schedule()
        prefill, decode_ = {}, {}
        for rid, n in out.num_scheduled_tokens.items():
            req = self.requests[rid]
            # a decode computes the newest token of a request whose prompt is done; a preempted request's
            # recompute is a prefill, also where its chunks run past the prompt
            is_decode = req.num_prompt_tokens <= computed[rid] == req.num_tokens - 1
            (decode_ if is_decode else prefill)[rid] = n
        admitted = tuple(r.req_id for r in out.scheduled_new_reqs) + tuple(out.scheduled_cached_reqs.resumed_req_ids)
        preempted = tuple(out.preempted_req_ids or ())
        running, waiting = self.running(), self.waiting()
        tokens = self._sampled(out)
        self.scheduler.update_from_output(out, _model_runner_output(tokens))
        finished = tuple(rid for rid in tokens if self.requests[rid].is_finished())
        context = sum(computed[rid] for rid in decode_)
        return Step(prefill, decode_, context, admitted, preempted, running, waiting, finished)

    def run(self, max_steps: int = 1000) -> list[Step]:
        """Steps until every request has left (fails if that takes more than ``max_steps``)."""
        steps = []
        while self.scheduler.has_unfinished_requests():
            assert len(steps) < max_steps, f"still running after {max_steps} steps"
            steps.append(self.step())
        return steps

    def run_pipelined(self, max_steps: int = 1000) -> int:
        """Steps as an async engine makes them: each scheduled before the previous one's tokens are back.

        Returns the number of steps. Every sampled token is :data:`TOKEN` (``stop_after`` is not
        honoured: the output a request has is one token behind while a step is in flight).
        """
        in_flight: deque[tuple[SchedulerOutput, dict[str, list[int]]]] = deque()
        steps = 0
        while self.scheduler.has_unfinished_requests():
            assert steps < max_steps, f"still running after {max_steps} steps"
            out = self.scheduler.schedule()
            steps += 1
            in_flight.append((out, {rid: [TOKEN] * len(t) for rid, t in self._sampled(out).items()}))
            if len(in_flight) == 2:
                self._update(*in_flight.popleft())
        while in_flight:
            self._update(*in_flight.popleft())
        return steps

    def _update(self, out: SchedulerOutput, tokens: dict[str, list[int]]) -> None:
        self.scheduler.update_from_output(out, _model_runner_output(tokens))

    def _sampled(self, out: SchedulerOutput) -> dict[str, list[int]]:
        """The token each scheduled request samples; a partial prompt chunk samples nothing (an empty list)."""
        return {rid: [self._token(rid)] if self._samples(rid) else [] for rid in out.num_scheduled_tokens}

    def _samples(self, rid: str) -> bool:
        req = self.requests[rid]
        # the step computed the last token it had: the model samples the next one
        return req.num_computed_tokens >= req.num_tokens

    def _token(self, rid: str) -> int:
        return STOP_TOKEN if self._stop_at.get(rid) == self.output_len(rid) + 1 else TOKEN


#: The status of a request waiting for its structured-output grammar.
_HELD = RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR


def _model_runner_output(tokens: dict[str, list[int]]) -> ModelRunnerOutput:
    ids = list(tokens)
    return ModelRunnerOutput(
        req_ids=ids, req_id_to_index={rid: i for i, rid in enumerate(ids)}, sampled_token_ids=list(tokens.values())
    )
