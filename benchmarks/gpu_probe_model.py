"""The decoder the step-cost probe times: a real layer shape, random weights, a paged KV cache.

Only PyTorch: the GPU machine the project is lent has no vLLM and no network, so the probe
cannot load a model or use vLLM's kernels. What it runs instead is the work of one engine step
of a Llama-style decoder, kernel for kernel as eager PyTorch issues it:

* embedding lookup; per layer RMSNorm, the fused QKV projection, RoPE (Qwen3: per-head q/k
  norms first), the new tokens' K/V written into the paged cache through a slot mapping
  (vLLM's ``reshape_and_cache``), attention, the output projection, RMSNorm, the fused
  gate/up projection, SiLU-and-mul and the down projection; then the final norm, the LM head
  on the positions that sample (the last token of each prompt and every decode) and a greedy
  argmax;
* attention through ``torch.nn.functional.scaled_dot_product_attention`` (on an H200 in
  bf16 that dispatches to its FlashAttention-2 kernel; :func:`choose_backends` records which
  backend each kind of call really used). Prefill prompts attend causally to their own new
  K/V; decodes attend to their context in the cache.

The KV cache is paged: a pool of ``[blocks, block_size, kv_heads, head_dim]`` per layer, a
block table per sequence, every new token written at its slot. The probe gives each
sequence consecutive blocks, so attention reads a decode batch's pages in place as one
strided view (no gather copy): the bytes a paged-attention kernel reads, which is what the
decode cost depends on. What the probe is not: vLLM's kernels, its CUDA graphs (eager
launches only), its scheduler and input preparation, or its sampler beyond argmax.

Fewer layers than the model's are built (``probe_layers``); each step marks the layer stack
apart from the rest, so a step's time is scaled to the full depth as
``total + (layers / probe_layers - 1) * layer_stack`` (:meth:`Decoder.step`).
"""

from __future__ import annotations

import itertools
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a decoder (a Hugging Face config's numbers)."""

    name: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    layers: int
    qk_norm: bool = False  # Qwen3: RMSNorm over each head's q and k before RoPE
    rope_theta: float = 500_000.0

    @property
    def layer_params(self) -> int:
        qkv = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
        out = self.heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        return qkv + out + mlp + 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)

    @property
    def params(self) -> int:
        """Parameters of the whole model (untied embedding and LM head)."""
        return self.layers * self.layer_params + 2 * self.vocab * self.hidden + self.hidden

    def kv_bytes_per_token(self, dtype_bytes: int, layers: int | None = None) -> int:
        return (self.layers if layers is None else layers) * 2 * self.kv_heads * self.head_dim * dtype_bytes


#: The shapes the probe knows: the paper's Figure 1 model, the Table 4 model, and a tiny one for CPUs.
SHAPES = {
    s.name: s
    for s in (
        ModelShape("llama-3.1-8b", 4096, 32, 8, 128, 14336, 128256, 32),
        ModelShape("qwen3-8b", 4096, 32, 8, 128, 12288, 151936, 36, qk_norm=True, rope_theta=1_000_000.0),
        ModelShape("tiny", 256, 4, 2, 64, 512, 4096, 8),
    )
}


@dataclass(frozen=True)
class Step:
    """The composition of one step: fresh prompts and ``batch`` decodes at ``context`` tokens each."""

    prompts: tuple[int, ...] = ()  # prompt lengths, each prefilled whole in this step
    batch: int = 0  # decoding sequences, one token each
    context: int = 0  # tokens already in the cache of each decoding sequence

    @property
    def prefill_tokens(self) -> int:
        return sum(self.prompts)

    @property
    def tokens(self) -> int:
        return self.prefill_tokens + self.batch

    @property
    def kv_tokens(self) -> int:
        """The KV the decodes read, as the scheduler's telemetry counts it (context before the step)."""
        return self.batch * self.context

    def blocks(self, block_size: int) -> int:
        """Pool blocks this step's sequences occupy (decodes first, consecutively, then the prompts)."""
        return self.batch * _ceil_div(self.context + 1, block_size) + sum(
            _ceil_div(n, block_size) for n in self.prompts
        )


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class _Inputs:
    """A step's tensors on the device, built before timing (vLLM prepares them on the CPU too)."""

    def __init__(self, step: Step, shape: ModelShape, block_size: int, device: torch.device, gen: torch.Generator):
        per_seq = _ceil_div(step.context + 1, block_size)
        self.step, self.per_seq = step, per_seq
        positions, slots, last = [], [], []
        base = step.batch * per_seq  # first block after the decodes' blocks
        offset = 0
        for n in step.prompts:
            positions.append(torch.arange(n))
            slots.append(base * block_size + torch.arange(n))
            base += _ceil_div(n, block_size)
            offset += n
            last.append(offset - 1)
        if step.batch:
            positions.append(torch.full((step.batch,), step.context))
            # sequence i owns blocks [i * per_seq, (i + 1) * per_seq): its new token's slot
            slots.append(torch.arange(step.batch) * per_seq * block_size + step.context)
            last += range(offset, offset + step.batch)
        self.ids = torch.randint(0, shape.vocab, (step.tokens,), generator=gen).to(device)
        self.positions = torch.cat(positions).to(device)
        self.slots = torch.cat(slots).to(device)
        self.sampled = torch.tensor(last, dtype=torch.long).to(device)
        # runs of equal prompt lengths, each one batched causal call: (token offset, prompts, length)
        self.groups: list[tuple[int, int, int]] = []
        offset = 0
        for n, run in itertools.groupby(step.prompts):
            count = len(list(run))
            self.groups.append((offset, count, n))
            offset += count * n


class Decoder:
    """``probe_layers`` decoder layers of ``shape`` with random weights and their paged KV pools."""

    def __init__(
        self,
        shape: ModelShape,
        probe_layers: int,
        pool_blocks: int,
        block_size: int,
        device: torch.device,
        dtype: torch.dtype,
        seed: int = 0,
    ) -> None:
        self.shape, self.probe_layers, self.block_size = shape, probe_layers, block_size
        self.device, self.dtype = device, dtype
        #: what a CPU step is timed with: wall time, or with one torch thread the thread's CPU time
        #: (``time.thread_time``), which other processes on a shared machine do not inflate
        self.cpu_clock: Callable[[], float] = time.perf_counter
        self.gen = torch.Generator().manual_seed(seed)
        dev_gen = torch.Generator(device=device).manual_seed(seed)
        s = shape

        def weight(*dims: int) -> torch.Tensor:
            return (torch.randn(*dims, generator=dev_gen, device=device, dtype=torch.float32) * 0.02).to(dtype)

        def ones(n: int) -> torch.Tensor:
            return torch.ones(n, device=device, dtype=dtype)

        qkv = (s.heads + 2 * s.kv_heads) * s.head_dim
        self.embed = weight(s.vocab, s.hidden)
        self.lm_head = weight(s.vocab, s.hidden)
        self.final_norm = ones(s.hidden)
        self.layers = [
            {
                "in_norm": ones(s.hidden),
                "qkv": weight(qkv, s.hidden),
                "o": weight(s.hidden, s.heads * s.head_dim),
                "post_norm": ones(s.hidden),
                "gate_up": weight(2 * s.intermediate, s.hidden),
                "down": weight(s.hidden, s.intermediate),
                "q_norm": ones(s.head_dim),
                "k_norm": ones(s.head_dim),
            }
            for _ in range(probe_layers)
        ]
        pool = (pool_blocks * block_size, s.kv_heads, s.head_dim)  # flat slots; blocks are block_size rows
        self.k_pool = [torch.empty(pool, device=device, dtype=dtype) for _ in range(probe_layers)]
        self.v_pool = [torch.empty(pool, device=device, dtype=dtype) for _ in range(probe_layers)]
        self.pool_blocks = pool_blocks
        self.fill_pools(dev_gen)
        self.backends = {"prefill": SDPBackend.MATH, "decode": SDPBackend.MATH}

    def fill_pools(self, gen: torch.Generator) -> None:
        """Random context in every page: a GPU runs a kernel on zeros faster than on data (lower power,
        higher clocks), and a decode reads context the probe never wrote."""
        for pool in (*self.k_pool, *self.v_pool):
            pool.normal_(generator=gen)

    # ----------------------------------------------------------------- building blocks

    def inputs(self, step: Step, max_position: int) -> _Inputs:
        need = step.blocks(self.block_size)
        if need > self.pool_blocks:
            raise ValueError(f"step needs {need} KV blocks, the pool has {self.pool_blocks}")
        inp = _Inputs(step, self.shape, self.block_size, self.device, self.gen)
        self._rope_table(max(max_position, step.context + 1, max(step.prompts, default=0)))
        return inp

    def _rope_table(self, positions: int) -> None:
        if getattr(self, "_rope_len", 0) >= positions:
            return
        d = self.shape.head_dim
        inv = 1.0 / (self.shape.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        freqs = torch.outer(torch.arange(positions, dtype=torch.float32), inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos = emb.cos().to(self.device, self.dtype)
        self.sin = emb.sin().to(self.device, self.dtype)
        self._rope_len = positions

    @staticmethod
    def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def attention(self, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inp: _Inputs) -> torch.Tensor:
        """Attention of the step's tokens (``q, k, v``: ``[tokens, heads, head_dim]``) after their K/V are cached."""
        s, step = self.shape, inp.step
        group = s.heads // s.kv_heads
        out = torch.empty_like(q)
        with sdpa_kernel(self.backends["prefill"]):
            for offset, count, n in inp.groups:  # prompts of one length: one batched causal call
                sl = slice(offset, offset + count * n)
                qg = q[sl].view(count, n, s.heads, s.head_dim).transpose(1, 2)
                # K/V heads repeated to the query heads: a copy of the new tokens only, cheap next to the
                # prefill's compute, and it keeps the call on the plain multi-head kernels
                kg = k[sl].view(count, n, s.kv_heads, s.head_dim).repeat_interleave(group, dim=2).transpose(1, 2)
                vg = v[sl].view(count, n, s.kv_heads, s.head_dim).repeat_interleave(group, dim=2).transpose(1, 2)
                og = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
                out[sl] = og.transpose(1, 2).reshape(count * n, s.heads, s.head_dim)
        if step.batch:
            p = step.prefill_tokens
            # a decode's query heads of one KV head fold into the query length: [batch, kv_heads, group, dim]
            qd = q[p:].view(step.batch, s.kv_heads, group, s.head_dim)
            kd, vd = (self._context(pool[i], inp) for pool in (self.k_pool, self.v_pool))
            with sdpa_kernel(self.backends["decode"]):
                od = F.scaled_dot_product_attention(qd, kd, vd)
            out[p:] = od.reshape(step.batch, s.heads, s.head_dim)
        return out

    def _context(self, pool: torch.Tensor, inp: _Inputs) -> torch.Tensor:
        """The decodes' cached K (or V), read in place: ``[batch, kv_heads, context + 1, head_dim]``.

        Sequence ``i`` owns blocks ``[i * per_seq, (i + 1) * per_seq)``, so the batch's pages are
        one strided view of the pool.
        """
        step, s = inp.step, self.shape
        rows = step.batch * inp.per_seq * self.block_size
        view = pool[:rows].view(step.batch, inp.per_seq * self.block_size, s.kv_heads, s.head_dim)
        return view[:, : step.context + 1].transpose(1, 2)

    def _layer(self, i: int, h: torch.Tensor, inp: _Inputs, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        s, w = self.shape, self.layers[i]
        x = F.rms_norm(h, (s.hidden,), w["in_norm"])
        q, k, v = F.linear(x, w["qkv"]).split(
            [s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], dim=-1
        )
        q = q.view(-1, s.heads, s.head_dim)
        k = k.view(-1, s.kv_heads, s.head_dim)
        v = v.view(-1, s.kv_heads, s.head_dim)
        if s.qk_norm:
            q = F.rms_norm(q, (s.head_dim,), w["q_norm"])
            k = F.rms_norm(k, (s.head_dim,), w["k_norm"])
        q = self._rope(q, cos, sin)
        k = self._rope(k, cos, sin)
        self.k_pool[i].index_copy_(0, inp.slots, k)
        self.v_pool[i].index_copy_(0, inp.slots, v)
        a = self.attention(i, q, k, v, inp)
        h = h + F.linear(a.view(-1, s.heads * s.head_dim), w["o"])
        x = F.rms_norm(h, (s.hidden,), w["post_norm"])
        gate, up = F.linear(x, w["gate_up"]).chunk(2, dim=-1)
        return h + F.linear(F.silu(gate) * up, w["down"])

    # ----------------------------------------------------------------- one timed step

    def forward(self, inp: _Inputs, timer: StepTimer) -> torch.Tensor:
        """One step; ``timer`` is marked before the embedding, around the layer stack and after sampling."""
        timer.mark()
        h = F.embedding(inp.ids, self.embed)
        cos, sin = self.cos[inp.positions].unsqueeze(1), self.sin[inp.positions].unsqueeze(1)
        timer.mark()
        for i in range(self.probe_layers):
            h = self._layer(i, h, inp, cos, sin)
        timer.mark()
        x = F.rms_norm(h[inp.sampled], (self.shape.hidden,), self.final_norm)
        tokens = F.linear(x, self.lm_head).argmax(dim=-1)
        timer.mark()
        return tokens

    def step(self, inp: _Inputs) -> tuple[float, float, float]:
        """``(seconds at full depth, measured seconds, layer-stack seconds)`` of one step.

        Synchronised before and after, as an engine step that returns its sampled tokens is.
        """
        timer = StepTimer(self.device, self.cpu_clock)
        self.forward(inp, timer)
        start, layers_start, layers_end, end = timer.times()
        total, stack = end - start, layers_end - layers_start
        return total + (self.shape.layers / self.probe_layers - 1.0) * stack, total, stack


class StepTimer:
    """Marks inside a step: CUDA events on a GPU (the GPU's own clock, launch gaps included), the
    decoder's ``cpu_clock`` on a CPU (where kernels run synchronously in the calling thread)."""

    def __init__(self, device: torch.device, cpu_clock: Callable[[], float] = time.perf_counter) -> None:
        self.cuda = device.type == "cuda"
        self.clock = cpu_clock
        if self.cuda:
            torch.cuda.synchronize(device)
        self._marks: list = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._marks.append(event)
        else:
            self._marks.append(self.clock())

    def times(self) -> list[float]:
        """Seconds of every mark since the first."""
        if not self.cuda:
            return [t - self._marks[0] for t in self._marks]
        self._marks[-1].synchronize()
        return [self._marks[0].elapsed_time(e) / 1000.0 for e in self._marks]


def choose_backends(decoder: Decoder) -> dict[str, str]:
    """Pick an SDPA backend for each kind of attention call of the probe, and check it.

    Tried in order FlashAttention, memory-efficient, cuDNN, math; the first whose output
    matches the math kernel's on a small prefill group and a small strided decode batch is
    kept (a backend that rejects a layout raises, and is skipped). Returns the names used,
    for the run's record.
    """
    s = decoder.shape
    order = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH]
    probe = Step(prompts=(2 * decoder.block_size + 3,) * 2, batch=3, context=decoder.block_size + 5)
    if probe.blocks(decoder.block_size) > decoder.pool_blocks:
        probe = Step(prompts=(5,), batch=1, context=2)
    inp = decoder.inputs(probe, 0)
    g = torch.Generator(device=decoder.device).manual_seed(1)

    def rand(*dims: int) -> torch.Tensor:
        return torch.randn(*dims, generator=g, device=decoder.device, dtype=torch.float32).to(decoder.dtype)

    q = rand(probe.tokens, s.heads, s.head_dim)
    k, v = rand(probe.tokens, s.kv_heads, s.head_dim), rand(probe.tokens, s.kv_heads, s.head_dim)
    decoder.k_pool[0].index_copy_(0, inp.slots, k)
    decoder.v_pool[0].index_copy_(0, inp.slots, v)
    decoder.backends = {"prefill": SDPBackend.MATH, "decode": SDPBackend.MATH}
    reference = decoder.attention(0, q, k, v, inp).float()
    tol = 5e-2 if decoder.dtype in (torch.bfloat16, torch.float16) else 1e-4
    p = probe.prefill_tokens
    parts = {"prefill": slice(0, p), "decode": slice(p, None)}
    chosen = {}
    for kind, rows in parts.items():
        for backend in order:
            decoder.backends = {**{k2: SDPBackend.MATH for k2 in parts}, kind: backend}
            try:
                with warnings.catch_warnings():  # a backend that cannot run says why, then raises
                    warnings.simplefilter("ignore")
                    out = decoder.attention(0, q, k, v, inp).float()
            except RuntimeError:
                continue
            if torch.allclose(out[rows], reference[rows], atol=tol, rtol=tol):
                chosen[kind] = backend
                break
    decoder.backends = {kind: chosen.get(kind, SDPBackend.MATH) for kind in parts}
    return {kind: b.name.lower() for kind, b in decoder.backends.items()}


def pool_blocks_for(steps: Sequence[Step], block_size: int) -> int:
    """The KV pool that holds the largest of ``steps`` (blocks)."""
    return max((st.blocks(block_size) for st in steps), default=1)
