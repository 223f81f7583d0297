"""A tiny attention-only model on one tensor-parallel rank, and the runner that executes steps.

The model is real arithmetic with seeded random weights: embedding -> per layer
(RMS norm, Q/K/V projections, attention through the backend, output projection,
residual) -> logits -> greedy token. It has this rank's shard of the attention
layers (``Hq = heads / TP`` query heads, ``Hk`` KV heads), which is exactly
what the workspace consumers see. There is no MLP or RoPE: they never touch
the workspace.

The :class:`ModelRunner` mirrors ``GPUModelRunner``: ``profile_run`` (a dummy
prefill), ``capture_model`` (one FULL uniform-decode dummy batch per capture
size, largest first, as ``_dummy_run(uniform_decode=True)``) and
``execute_model``. Capture goes through a *decode runner*:
:class:`EagerDecodeRunner` on CPU/meta records what a capture would freeze (the
workspace buffer pointers); :mod:`tqlab.engine.cuda_graph` provides a real
``torch.cuda.CUDAGraph`` runner on CUDA.

Speculative decoding (``num_speculative_tokens = k > 0``) follows vLLM 0.33's
TurboQuant backend: a decode row carries ``1 + k`` tokens, above the builder's
``reorder_batch_threshold`` of 1, so the target model's rows go through
``_prefill_attention``'s short-continuation path (the decode kernel with its own
scratch, no workspace call); the drafter (one attention layer with its own KV
cache, like an MTP/EAGLE head) then runs ``k - 1`` one-token decode passes
through ``_decode_attention``, which ask the workspace for decode views at the
batch's rows. Draft tokens are never accepted here (the workspace calls do not
depend on acceptance), so outputs equal a run without speculation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tqlab.attention import TurboQuantAttentionBackend
from tqlab.core.config import EngineConfig
from tqlab.core.vllm_rules import decode_rows
from tqlab.engine.scheduler import BlockRuns, SchedulerOutput

__all__ = ["CaptureRecord", "EagerDecodeRunner", "ModelRunner", "TinyModel"]


class TinyModel:
    """Seeded attention-only transformer shard. Hidden size ``Hq * D``; vocabulary ``vocab_size``."""

    def __init__(self, config: EngineConfig, device: torch.device, *, seed: int = 0, vocab_size: int = 512):
        self.config = config
        self.device = device
        self.vocab_size = vocab_size
        hq, hk, d = config.num_heads_per_rank, config.num_kv_heads_per_rank, config.head_dim
        self.hidden = hq * d
        # Weights and activations in the model dtype, except on CPU, where bf16/fp16
        # matmuls are slow: float32 there (K/V are still stored in the cache format,
        # and workspace views keep the model dtype).
        dt = torch.float32 if device.type == "cpu" else config.torch_dtype
        self.compute_dtype = dt
        g = torch.Generator().manual_seed(seed)

        def w(*shape: int, scale: float) -> torch.Tensor:
            if device.type == "meta":
                return torch.empty(shape, dtype=dt, device=device)
            return (torch.randn(shape, generator=g) * scale).to(device=device, dtype=dt)

        s = 1.0 / math.sqrt(self.hidden)
        self.embed = w(vocab_size, self.hidden, scale=1.0)
        def layer() -> dict[str, torch.Tensor]:
            return dict(wq=w(self.hidden, hq * d, scale=s), wk=w(self.hidden, hk * d, scale=s),
                        wv=w(self.hidden, hk * d, scale=s), wo=w(hq * d, self.hidden, scale=s))

        self.layers = [layer() for _ in range(config.num_hidden_layers)]
        # The drafter's attention layer (MTP/EAGLE head), index num_hidden_layers in qkv()/out().
        if config.num_speculative_tokens:
            self.layers.append(layer())

    @staticmethod
    def _norm(h: torch.Tensor) -> torch.Tensor:
        if h.device.type == "meta":  # shapes only: meta's pow/mean/rsqrt decompose in Python (~4 ms a call)
            return torch.empty_like(h)
        hf = h.float()
        return (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(h.dtype)

    def qkv(self, layer: int, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``h`` ``(N, hidden)`` -> q ``(N, Hq, D)``, k, v ``(N, Hk, D)``."""
        p, c, x = self.layers[layer], self.config, self._norm(h)
        n = h.shape[0]
        return (
            (x @ p["wq"]).view(n, c.num_heads_per_rank, c.head_dim),
            (x @ p["wk"]).view(n, c.num_kv_heads_per_rank, c.head_dim),
            (x @ p["wv"]).view(n, c.num_kv_heads_per_rank, c.head_dim),
        )

    def out(self, layer: int, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        y = attn.reshape(h.shape[0], -1).to(h.dtype) @ self.layers[layer]["wo"]
        return y if h.device.type == "meta" else h + y  # meta: the residual add's shape is y's (add decomposes in Python)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self._norm(h).float() @ self.embed.float().T

    def reference_forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Dense causal forward over a whole sequence without cache or chunking: logits ``(N, vocab)``.

        The ground truth the engine's chunked, paged, workspace-backed path is checked against.
        """
        import torch.nn.functional as F

        c = self.config
        h = self.embed[token_ids]
        group = c.num_heads_per_rank // c.num_kv_heads_per_rank
        for i in range(c.num_hidden_layers):
            q, k, v = self.qkv(i, h)
            qt, kt, vt = (t.transpose(0, 1)[None].float() for t in (q, k, v))
            kt, vt = kt.repeat_interleave(group, 1), vt.repeat_interleave(group, 1)
            a = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=1.0 / math.sqrt(c.head_dim))
            h = self.out(i, h, a[0].transpose(0, 1))
        return self.logits(h)


@dataclass
class CaptureRecord:
    """What capturing one decode bucket froze: batch size, workspace pointers and sizes at capture."""

    batch_size: int
    workspace_ptrs: list[int]
    workspace_bytes: list[int]
    graph: object | None = None


class EagerDecodeRunner:
    """Decode "capture" without CUDA graphs: run the step eagerly, record what a graph would freeze."""

    kind = "eager"

    def __init__(self, runner: "ModelRunner"):
        self.runner = runner
        self.records: dict[int, CaptureRecord] = {}

    def capture(self, batch_size: int, num_warmups: int = 1) -> CaptureRecord:
        for _ in range(num_warmups + 1):
            self.runner.dummy_decode(batch_size)
        ws = self.runner.workspace
        rec = CaptureRecord(batch_size, ws.data_ptrs(), ws.sizes_bytes())
        self.records[batch_size] = rec
        return rec

    def run(self, input_ids, slot_mapping, block_tables, seq_lens) -> torch.Tensor:
        return self.runner.decode_forward(input_ids, slot_mapping, block_tables, seq_lens)


class ModelRunner:
    """Executes scheduler steps for one rank; owns the model, the KV cache and the backend."""

    def __init__(self, config: EngineConfig, backend: TurboQuantAttentionBackend, device: torch.device,
                 num_blocks: int, max_blocks_per_seq: int, *, seed: int = 0):
        self.config = config
        self.backend = backend
        self.workspace = backend.workspace
        self.device = device
        self.is_meta = device.type == "meta"
        self.model = TinyModel(config, device, seed=seed)
        self.kv_caches = [backend.cache_format.allocate(num_blocks, device) for _ in range(config.num_hidden_layers)]
        # The drafter's own KV cache (speculative decoding only).
        self.draft_kv_cache = backend.cache_format.allocate(num_blocks, device) if config.num_speculative_tokens else None
        self.max_blocks_per_seq = max_blocks_per_seq
        self.decode_runner = EagerDecodeRunner(self)

    # -- forward pieces ------------------------------------------------------ #
    def decode_forward(self, input_ids, slot_mapping, block_tables, seq_lens) -> torch.Tensor:
        """A pure-decode batch through every layer: ``B`` tokens -> logits ``(B, vocab)``.

        This is the function a CUDA graph captures: fixed shapes for a bucket,
        inputs read from static tensors, workspace views requested inside.
        """
        h = self.model.embed[input_ids]
        for i, cache in enumerate(self.kv_caches):
            q, k, v = self.model.qkv(i, h)
            self.backend.do_kv_cache_update(cache, k, v, slot_mapping)
            h = self.model.out(i, h, self.backend.forward_decode(q, cache, block_tables, seq_lens))
        return self.model.logits(h)

    def spec_decode_forward(self, input_ids, slot_mapping, block_tables, seq_lens) -> torch.Tensor:
        """A decode step with speculation: target rows without workspace, then the drafter's one-token passes.

        Target: ``forward_spec_verify`` per layer (vLLM routes ``1 + k``-token rows to the
        decode kernel with its own scratch). Drafter: ``k - 1`` passes of ``forward_decode``
        on its own layer and KV cache (workspace decode views at ``B`` rows). Returns the
        target's logits ``(B, vocab)``.
        """
        h = self.model.embed[input_ids]
        for i, cache in enumerate(self.kv_caches):
            q, k, v = self.model.qkv(i, h)
            self.backend.do_kv_cache_update(cache, k, v, slot_mapping)
            h = self.model.out(i, h, self.backend.forward_spec_verify(q, cache, block_tables, seq_lens))
        self._draft_passes(h, slot_mapping, block_tables, seq_lens)
        return self.model.logits(h)

    def _decode_rows(self, q, cache, block_tables, seq_lens) -> torch.Tensor:
        """Decode rows of a mixed step: split-KV decode, or the spec-verify path when ``k > 0``."""
        if self.config.num_speculative_tokens:
            return self.backend.forward_spec_verify(q, cache, block_tables, seq_lens)
        return self.backend.forward_decode(q, cache, block_tables, seq_lens)

    def _draft_passes(self, h, slot_mapping, block_tables, seq_lens) -> None:
        """The drafter's ``k - 1`` one-token decode passes over ``B`` rows (outputs discarded: no draft accepted)."""
        d = self.config.num_hidden_layers
        for _ in range(self.config.num_speculative_tokens - 1):
            q, k, v = self.model.qkv(d, h)
            self.backend.do_kv_cache_update(self.draft_kv_cache, k, v, slot_mapping)
            h = self.model.out(d, h, self.backend.forward_decode(q, self.draft_kv_cache, block_tables, seq_lens))

    def dummy_spec_decode(self, rows: int, query_len: int) -> None:
        """Capture-time uniform decode with ``query_len > 1``: ``rows`` first chunks of ``query_len`` tokens.

        ``_dummy_run`` sets ``seq_lens = max_query_len``, so each row is a first-chunk prefill
        (``q_len == seq_len``) in TurboQuant's ``_prefill_attention``: no workspace call.
        """
        n = rows * query_len
        h = self.model.embed[torch.zeros(n, dtype=torch.long, device=self.device)]
        bt = torch.zeros(self.max_blocks_per_seq, dtype=torch.int32, device=self.device)
        for i, cache in enumerate(self.kv_caches):
            q, k, v = self.model.qkv(i, h)
            outs = [self.backend.forward_prefill(q[r * query_len:(r + 1) * query_len], k[r * query_len:(r + 1) * query_len],
                                                 v[r * query_len:(r + 1) * query_len], cache, bt, cached_len=0)
                    for r in range(rows)]
            h = self.model.out(i, h, outs[0] if len(outs) == 1 else torch.cat(outs, dim=0))  # one part: no copy

    def dummy_decode(self, batch_size: int) -> torch.Tensor:
        """Capture-time decode: ``batch_size`` rows of length 1 on the null block (vLLM fills seq_lens with 1)."""
        ids = torch.zeros(batch_size, dtype=torch.long, device=self.device)
        slots = torch.full((batch_size,), -1, dtype=torch.long, device=self.device)
        bt = torch.zeros((batch_size, self.max_blocks_per_seq), dtype=torch.int32, device=self.device)
        seq = torch.ones(batch_size, dtype=torch.int32, device=self.device)
        return self.decode_forward(ids, slots, bt, seq)

    def profile_run(self, num_tokens: int) -> None:
        """vLLM's profile run: a dummy prefill of ``num_tokens`` fresh tokens (no cached tokens), not stored."""
        ids = torch.zeros(num_tokens, dtype=torch.long, device=self.device)
        h = self.model.embed[ids]
        for i, cache in enumerate(self.kv_caches):
            q, k, v = self.model.qkv(i, h)
            bt = torch.zeros(self.max_blocks_per_seq, dtype=torch.int32, device=self.device)
            h = self.model.out(i, h, self.backend.forward_prefill(q, k, v, cache, bt, cached_len=0))

    def capture_model(self, sizes: tuple[int, ...]) -> list[CaptureRecord]:
        """Warm up and capture one FULL uniform-decode dummy batch per size in ``sizes`` (tokens), largest first.

        ``sizes`` are :func:`tqlab.core.vllm_rules.decode_capture_sizes`. A batch has
        :func:`tqlab.core.vllm_rules.decode_rows` rows (``GPUModelRunner._dummy_run``):
        decode rows through the decode runner when ``k = 0``, else first-chunk rows
        (:meth:`dummy_spec_decode`, no workspace call).
        """
        q = self.config.uniform_decode_query_len
        records = []
        for size in sorted(sizes, reverse=True):
            rows = decode_rows(self.config, size)
            if q == 1:
                records.append(self.decode_runner.capture(rows))
            else:
                self.dummy_spec_decode(rows, q)
                ws = self.workspace
                records.append(CaptureRecord(rows, ws.data_ptrs(), ws.sizes_bytes()))
        return records

    # -- one scheduler step -------------------------------------------------- #
    def _block_table(self, blocks: BlockRuns) -> torch.Tensor:
        if self.is_meta:  # shapes only: no host tensor of max_model_len / block_size entries
            return torch.empty(self.max_blocks_per_seq, dtype=torch.int32, device="meta")
        row = torch.zeros(self.max_blocks_per_seq, dtype=torch.int32)
        at = 0
        for a, b in blocks.runs:
            row[at: at + b - a] = torch.arange(a, b, dtype=torch.int32)
            at += b - a
        return row

    def _slots(self, blocks: BlockRuns, start: int, n: int) -> torch.Tensor:
        """KV-cache slot of each position ``start .. start + n - 1`` (block id * block_size + offset); O(n + runs)."""
        if self.is_meta:
            return torch.empty(n, dtype=torch.long, device="meta")
        bs = self.config.block_size
        pos = torch.arange(start, start + n)
        runs = blocks.runs
        first = torch.tensor([a for a, _ in runs], dtype=torch.long)
        lens = torch.tensor([b - a for a, b in runs], dtype=torch.long)
        ends = torch.cumsum(lens, 0)  # block index one past each run
        idx = pos // bs
        run = torch.searchsorted(ends, idx, right=True)
        block = first[run] + idx - (ends[run] - lens[run])
        return block * bs + pos % bs

    def execute_model(self, sched: SchedulerOutput) -> dict[int, int]:
        """Run one step; returns ``request_id -> sampled token`` for rows that produce one."""
        dev = self.device
        sampled: dict[int, int] = {}
        if sched.decodes and not sched.prefills:
            ids = torch.tensor([r.token_at(r.num_tokens - 1) for r in sched.decodes], device=dev)
            slots = torch.cat([self._slots(r.block_ids, r.num_tokens - 1, 1) for r in sched.decodes]).to(dev)
            bt = torch.stack([self._block_table(r.block_ids) for r in sched.decodes]).to(dev)
            seq = torch.tensor([r.num_tokens for r in sched.decodes], dtype=torch.int32, device=dev)
            if self.config.num_speculative_tokens:
                logits = self.spec_decode_forward(ids, slots, bt, seq)
            else:
                logits = self.decode_runner.run(ids, slots, bt, seq)
            for r, tok in zip(sched.decodes, self._greedy(logits)):
                sampled[r.request_id] = tok
            return sampled
        # Mixed or prefill-only step: eager (vLLM captures only uniform decode batches).
        nd = len(sched.decodes)
        slots = [self._slots(r.block_ids, r.num_tokens - 1, 1) for r in sched.decodes]
        slots += [self._slots(r.block_ids, c, q) for r, c, q in sched.prefills]
        if self.is_meta:  # shapes only: no host list of the step's token ids (10**9 of them on meta)
            ids = torch.empty(sched.num_tokens, dtype=torch.long, device=dev)
        else:
            toks = [r.token_at(r.num_tokens - 1) for r in sched.decodes]
            for r, c, q in sched.prefills:
                toks += [r.token_at(p) for p in range(c, c + q)]
            ids = torch.tensor(toks, dtype=torch.long, device=dev)
        slot_mapping = torch.cat(slots).to(dev)
        if nd:
            bt_dec = torch.stack([self._block_table(r.block_ids) for r in sched.decodes]).to(dev)
            seq_dec = torch.tensor([r.num_tokens for r in sched.decodes], dtype=torch.int32, device=dev)
        h = self.model.embed[ids]
        for i, cache in enumerate(self.kv_caches):
            q, k, v = self.model.qkv(i, h)
            self.backend.do_kv_cache_update(cache, k, v, slot_mapping)
            outs = []
            if nd:
                outs.append(self._decode_rows(q[:nd], cache, bt_dec, seq_dec).clone())
            start = nd
            for r, c, qn in sched.prefills:
                sl = slice(start, start + qn)
                outs.append(self.backend.forward_prefill(q[sl], k[sl], v[sl], cache,
                                                         self._block_table(r.block_ids).to(dev), cached_len=c))
                start += qn
            h = self.model.out(i, h, outs[0] if len(outs) == 1 else torch.cat(outs, dim=0))  # one part: no copy
        if nd and self.config.num_speculative_tokens:
            self._draft_passes(h[:nd], slot_mapping[:nd], bt_dec, seq_dec)
        # Sample for decodes and for prefills that reach the end of their prompt.
        last_rows = list(range(nd))
        owners = list(sched.decodes)
        start = nd
        for r, c, qn in sched.prefills:
            start += qn
            if c + qn == r.prompt_len:
                last_rows.append(start - 1)
                owners.append(r)
        if owners:
            logits = self.model.logits(h[torch.tensor(last_rows, device=dev)])
            for r, tok in zip(owners, self._greedy(logits)):
                sampled[r.request_id] = tok
        return sampled

    def _greedy(self, logits: torch.Tensor) -> list[int]:
        if self.is_meta:
            return [0] * logits.shape[0]
        return logits.argmax(dim=-1).tolist()
