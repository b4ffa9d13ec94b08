"""The per-request output budget: how much generated output one request may ask an engine for.

vLLM bounds each factor of a request on its own (``n`` and the prompts of a
completion at ``max_num_seqs`` here, ``max_tokens`` at the model's length,
``logprobs`` at 20) but not their product, and the product is what the engine
generates and what the answer holds: ``{"n": 64, "max_tokens": 2000,
"logprobs": 20, "ignore_eos": true}`` asks for 2.7 million tokens and
alternatives, built in full in the replica and again in the ingress, while one
client occupies most of the engine's sequences for minutes.

The budget is on what a request *asks* for (an EOS may end it sooner):

    prompts x n x max_tokens x (1 + logprobs per token)

with ``max_tokens`` left unset counted as the model's length (vLLM's default
is what is left of it after the prompt). The default limit is the engine's KV
cache capacity in tokens: vLLM refuses to start an engine whose cache cannot
hold one ``max_model_len`` sequence, so a plain request always fits, and a
request over it asks for more output than the engine holds at once.

Pure: no vLLM or Ray import. The replica (:mod:`ebplus.replicas.server`) checks
the parsed request before the engine sees it; the plain-vLLM plugin checks the
JSON body in the API server (:mod:`ebplus.deploy.vllm_plugin`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: The routes whose bodies ask for generated output (the OpenAI API's).
GENERATING_ROUTES = ("/v1/completions", "/v1/chat/completions")


def _count(value: Any, default: int) -> int:
    """A non-negative integer field of a request, ``default`` when unset or not a number
    (a malformed field is the request parser's to refuse, not ours)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    return max(int(value), 0)


def _prompts(prompt: Any) -> int:
    """How many prompts a completion request carries (a list of strings or of token lists is a batch)."""
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        return len(prompt)
    return 1


def requested_output(get: Callable[[str], Any], max_model_len: int) -> int:
    """The output a request asks for, in tokens and per-token alternatives.

    ``get(name)`` reads a field of the request (``dict.get`` of a JSON body, or
    ``getattr`` of a parsed one) and answers ``None`` when it is unset. Chat
    requests say ``max_completion_tokens`` (or the older ``max_tokens``) and
    ``logprobs: true`` with ``top_logprobs``; completions say ``max_tokens`` and
    ``logprobs: <k>``.
    """
    max_tokens = get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = get("max_tokens")
    tokens = _count(max_tokens, max_model_len)
    logprobs = get("logprobs")
    if isinstance(logprobs, bool):  # chat: a switch, with the number of alternatives beside it
        alternatives = _count(get("top_logprobs"), 0) if logprobs else 0
    else:
        alternatives = _count(logprobs, 0)
    choices = max(_count(get("n"), 1), _count(get("best_of"), 1))
    return _prompts(get("prompt")) * choices * tokens * (1 + alternatives)


@dataclass(frozen=True)
class OutputBudget:
    """The limit one engine puts on a request's :func:`requested_output` (``limit`` 0: none)."""

    limit: int
    max_model_len: int

    @classmethod
    def for_engine(cls, vllm_config: Any, configured: int | None) -> OutputBudget:
        """The budget of the engine ``vllm_config`` describes: ``configured``, else its KV capacity.

        The API-side ``VllmConfig`` carries the cache size the engine core measured
        (vLLM's client copies ``num_gpu_blocks`` from the core's start-up answer), so
        the limit is known before the first request.
        """
        cache = vllm_config.cache_config
        capacity = int(cache.num_gpu_blocks or 0) * int(cache.block_size)
        return cls(configured if configured is not None else capacity, int(vllm_config.model_config.max_model_len))

    def problem(self, get: Callable[[str], Any]) -> str | None:
        """Why a request is refused (the message of its 400), or ``None`` when it fits."""
        if self.limit <= 0:
            return None
        asked = requested_output(get, self.max_model_len)
        if asked <= self.limit:
            return None
        return (
            f"the request asks for up to {asked:,} output tokens and alternatives (prompts x n x max_tokens x "
            f"(1 + logprobs)); the limit per request is {self.limit:,}: ask for fewer choices, tokens or "
            "logprobs, or split the request"
        )
