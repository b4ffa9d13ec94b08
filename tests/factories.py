"""Small builders of the control loop's messages, shared by the test tiers."""

from __future__ import annotations

from collections.abc import Sequence

from ebplus.controller.cost_model import CostModel
from ebplus.controller.messages import (
    CompletionRecord,
    EngineFacts,
    FinishReason,
    Mode,
    Registration,
    StepRecord,
    TelemetryBatch,
    encode,
)

#: A small prior cost model (seconds, seconds/token).
PRIOR = CostModel(alpha_p=1e-3, beta_p=1e-5, alpha_d=1e-2, beta_d=1e-5, beta_mb=(1e-5, 0.0, 0.0))


def registration(
    replica_id: str,
    mode: Mode | str = Mode.AUTO,
    kv_capacity_tokens: int = 100_000,
    max_num_seqs: int = 64,
    prior: CostModel = PRIOR,
    device: str = "cpu",
    model: str = "",
) -> Registration:
    facts = EngineFacts(kv_capacity_tokens=kv_capacity_tokens, max_num_seqs=max_num_seqs, device=device)
    return Registration(replica_id=replica_id, mode=Mode(mode), facts=facts, prior=prior, model=model)


def batch(
    replica_id: str,
    completions: Sequence[CompletionRecord] = (),
    steps: Sequence[StepRecord] = (),
    **fields: object,
) -> bytes:
    """A :class:`TelemetryBatch` as a replica sends it: encoded (``FleetController.ingest`` takes the wire form)."""
    # NOTE: lists only when given sequences: hostile tests hand over garbage on purpose
    comps = list(completions) if isinstance(completions, list | tuple) else completions
    steps_ = list(steps) if isinstance(steps, list | tuple) else steps
    return encode(TelemetryBatch(replica_id=replica_id, completions=comps, steps=steps_, **fields))  # type: ignore[arg-type]


def completions(n: int, start: int = 0, input_len: int = 10, finish: FinishReason = FinishReason.STOP) -> list:
    """``n`` completions with output lengths cycling 1..50."""
    return [CompletionRecord(input_len + i, 1 + (start + i) % 50, finish) for i in range(n)]
