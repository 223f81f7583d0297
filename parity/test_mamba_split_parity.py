"""Mamba block-aligned prefill split: vLLM 0.33's own ``Scheduler._mamba_block_aligned_split`` vs tqlab's.

vLLM's method (``vllm/v1/core/sched/scheduler.py``) runs as an unbound function on a
``SimpleNamespace`` stand-in for the scheduler holding exactly the attributes it reads, set
as ``Scheduler.__init__`` sets them for the case tqlab models
(:func:`tqlab.predict.analysis.mamba_block_aligned_split`):

* ``mamba_cache_mode`` "align" (the method only runs then: ``need_mamba_block_aligned_split``);
* ``hash_block_size == block_size == cache_config.block_size`` (no ``--prefix-match-unit``), so
  ``mamba_partial_cache_hit`` and ``mamba_shared_prefix_checkpoint`` are False;
* no EAGLE block drop, no hash lookahead tokens, no ``long_prefill_token_threshold``;
* Mamba layers that save the checkpoint inside the last chunk: ``mamba_has_prefill_checkpoint_blocks``
  True, ``mamba_prefill_checkpoint_alignment`` 1 (``MambaMixer2.get_kv_cache_spec``);
* ``max_num_scheduled_tokens = max_num_batched_tokens`` (no ``max_num_scheduled_tokens`` set).

The request stand-in is a fresh prefill with no prefix-cache hit (``num_tokens ==
num_prompt_tokens``, no shared-prefix junction). ``SimpleNamespace`` raises ``AttributeError`` on
any attribute it lacks, so a vLLM that read more would fail here, not silently differ.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from tqlab.predict import analysis as A
from tqlab.core.config import EngineConfig

NEMOTRON = "nemotron-3-super-120b-a12b"
N_RANDOM = 4000


def _config(block_size: int, max_num_batched_tokens: int) -> EngineConfig:
    return EngineConfig(num_attention_heads=4, num_key_value_heads=1, head_dim=64, max_model_len=65536, max_num_seqs=1,
                        max_num_batched_tokens=max_num_batched_tokens, block_size=block_size,
                        mamba_block_aligned_split=True)


def _scheduler(cfg: EngineConfig) -> SimpleNamespace:
    """What ``Scheduler._mamba_block_aligned_split`` reads of ``self``, for the modelled case."""
    bs = cfg.block_size
    return SimpleNamespace(
        cache_config=SimpleNamespace(block_size=bs), block_size=bs, hash_block_size=bs,
        mamba_partial_cache_hit=False, use_eagle_block_drop=False, num_hash_lookahead_tokens=0,
        mamba_has_prefill_checkpoint_blocks=True, mamba_prefill_checkpoint_alignment=1,
        max_num_scheduled_tokens=cfg.max_num_batched_tokens,
        scheduler_config=SimpleNamespace(long_prefill_token_threshold=0), mamba_shared_prefix_checkpoint=False,
    )


def vllm_split(cfg: EngineConfig, num_computed_tokens: int, num_new_tokens: int, prompt_len: int) -> int:
    """vLLM 0.33's ``Scheduler._mamba_block_aligned_split`` for a request alone with ``num_computed_tokens`` done."""
    from vllm.v1.core.sched.scheduler import Scheduler

    req = SimpleNamespace(num_computed_tokens=num_computed_tokens, num_prompt_tokens=prompt_len,
                          num_tokens=prompt_len, shared_prefix_boundary=0)
    return Scheduler._mamba_block_aligned_split(_scheduler(cfg), req, num_new_tokens)


def vllm_chunks(cfg: EngineConfig, n: int, first_budget: int | None = None) -> list[tuple[int, int]]:
    """``(cached_len, q_len)`` per step of a prompt of ``n`` tokens alone, each step's new tokens cut by vLLM's method
    (budget ``max_num_batched_tokens``; ``first_budget`` for the first step, as a busy step leaves)."""
    out, done, step = [], 0, 0
    while done < n:
        budget = first_budget if step == 0 and first_budget is not None else cfg.max_num_batched_tokens
        q = vllm_split(cfg, done, min(budget, n - done), n)
        assert q > 0, (cfg.block_size, cfg.max_num_batched_tokens, n, done)  # alone: every step makes progress
        out.append((done, q))
        done, step = done + q, step + 1
    return out


def _random_case(rng: random.Random) -> tuple[int, int, int, int, int]:
    """``(block_size, max_num_batched_tokens, num_computed_tokens, num_new_tokens, prompt_len)``."""
    bs = rng.choice([16, 32, 64, 128, 160, 208, 528, 1056, 2080, 16 * rng.randint(1, 130)])
    m = rng.choice([bs, 2 * bs, 4096, 8192, rng.randint(bs, 16384)])
    n = rng.randint(1, 40_000)
    if rng.random() < 0.5:
        start = bs * rng.randint(0, (n - 1) // bs)  # on a block boundary
    else:
        start = rng.randint(0, n - 1)  # anywhere, mostly mid-block
    rest = n - start
    q = min(m, rest) if rng.random() < 0.5 else rng.randint(1, min(m, rest))  # full budget, or a busy step's share
    return bs, m, start, q, n


def test_random_cases_equal_vllms(record):
    rng = random.Random(20260433)
    configs: dict[tuple[int, int], EngineConfig] = {}
    mismatches, cut, aligned_starts = [], 0, 0
    for _ in range(N_RANDOM):
        bs, m, start, q, n = _random_case(rng)
        cfg = configs.get((bs, m)) or configs.setdefault((bs, m), _config(bs, m))
        want = vllm_split(cfg, start, q, n)
        got = A.mamba_block_aligned_split(cfg, start, q, n)
        if got != want:
            mismatches.append({"block_size": bs, "max_num_batched_tokens": m, "start": start, "q": q, "n": n,
                               "vllm": want, "tqlab": got})
        cut += want != q
        aligned_starts += start % bs == 0
    record("cases", N_RANDOM)
    record("cases_cut_by_vllm", cut)
    record("mismatches", len(mismatches))
    assert not mismatches, mismatches[:5]
    # the cases exercise both branches and both kinds of start
    assert N_RANDOM // 10 < cut < N_RANDOM and N_RANDOM // 4 < aligned_starts < 3 * N_RANDOM // 4


def test_decode_steps_are_left_alone():
    cfg = _config(16, 4096)
    for n in (1, 17, 4225):
        assert vllm_split(cfg, n, 1, n) == A.mamba_block_aligned_split(cfg, n, 1, n) == 1


@pytest.mark.parametrize("n, chunks", [
    # 4096 is a multiple of 16: the first chunk keeps its 4096 tokens; the last 129 stay whole (checkpoint
    # 4224 is saved inside the chunk), so the second chunk dequantizes 4096 cached tokens: the report's crash
    (4225, [(0, 4096), (4096, 129)]),
    (8192, [(0, 4096), (4096, 4096)]),
])
def test_nemotron_preset_prompts_alone(n, chunks):
    cfg = EngineConfig.from_preset(NEMOTRON)
    assert (cfg.block_size, cfg.max_num_batched_tokens, cfg.mamba_block_aligned_split) == (16, 4096, True)
    assert vllm_chunks(cfg, n) == chunks == A.prefill_chunks(cfg, n)


def test_a_513_token_first_step_is_cut_to_512():
    """A busy first step leaves 513 tokens of a 642-token prompt: vLLM cuts them to the 512 block boundary."""
    cfg = EngineConfig.from_preset(NEMOTRON)
    assert vllm_split(cfg, 0, 513, 642) == A.mamba_block_aligned_split(cfg, 0, 513, 642) == 512
    # then the rest (130 tokens, checkpoint 640 saved inside the last chunk) in one step
    assert vllm_split(cfg, 512, 130, 642) == A.mamba_block_aligned_split(cfg, 512, 130, 642) == 130
    assert vllm_chunks(cfg, 642, first_budget=513) == [(0, 512), (512, 130)]


@pytest.mark.parametrize("bs, m", [(16, 4096), (2080, 4096), (2080, 2080), (208, 500), (160, 300), (1056, 8192),
                                   (48, 100), (16, 16)])
def test_prefill_chunks_alone_equal_vllms_step_by_step(bs, m, record):
    """The engine-level consequence: the chunks a request alone gets, step by step through vLLM's method,
    equal :func:`tqlab.predict.analysis.prefill_chunks` (which the first-failing-prompt closed forms use)."""
    cfg = _config(bs, m)
    lengths = sorted({*range(1, 3 * m + 2 * bs + 3, max(1, m // 97)), *(k * bs + d for k in range(1, 3 * m // bs + 2)
                                                                       for d in (-1, 0, 1)),
                      *(k * m + d for k in range(1, 4) for d in (-1, 0, 1, 128, 129, 130)), 40_000} - {0})
    bad = [(n, vllm_chunks(cfg, n), A.prefill_chunks(cfg, n)) for n in lengths
           if vllm_chunks(cfg, n) != A.prefill_chunks(cfg, n)]
    record("prompts", len(lengths))
    assert not bad, bad[:3]
