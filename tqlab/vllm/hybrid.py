"""Hybrid (Mamba + attention) models as vLLM 0.33 sets them up: the attention block size and the block-aligned split.

Both readers of :mod:`tqlab.vllm.deployment` (a config.json, a preset) call these on a
:class:`~tqlab.vllm.draft.DeploymentDraft`; :func:`hybrid_attention_block_size` is also public
(notebooks and tests size blocks with it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tqlab.core.config import is_turboquant, parse_dtype, step_token_budget
from tqlab.core.notes import NoteKind
from tqlab.core.workspace_layout import cdiv, round_up
from tqlab.turboquant.spec import get_spec
from tqlab.vllm.draft import DeploymentDraft
from tqlab.vllm.flags import VllmArgsError
from tqlab.vllm.hf_config import ModelShape

__all__ = ["SPLIT", "SPLIT_FLAGS", "TQ_KERNEL_BLOCK", "apply_hybrid_block", "apply_mamba_split",
           "hybrid_attention_block_size"]

TQ_KERNEL_BLOCK = 16
"""min of ``TurboQuantAttentionBackend.get_supported_kernel_block_sizes()`` = [16, 32, 64, 128]."""
SPLIT = "mamba_block_aligned_split"
SPLIT_FLAGS = ("--enable-prefix-caching", "--mamba-cache-mode")
"""Flags read for a hybrid model: they decide :func:`apply_mamba_split` (otherwise no effect on the workspace)."""


def hybrid_attention_block_size(shape: ModelShape, *, kv_cache_dtype: str, dtype: Any, tp: int,
                                block_size: int = 16, mamba_cache_dtype: str = "auto",
                                mamba_ssm_cache_dtype: str = "auto", num_speculative_tokens: int = 0) -> tuple[int, str] | None:
    """vLLM 0.33's attention block size for a hybrid model, or None when config.json has no Mamba state.

    Mirrors ``vllm/platforms/interface.py`` ``Platform._align_hybrid_block_size``
    (with ``mamba_cache_mode`` "none"): the attention page of one token on a
    rank (TurboQuant: ``slot_bytes(D) * Hk`` per ``TurboQuantAttentionBackend.customize_spec``;
    else ``2 * Hk * D * itemsize``), the Mamba state page (:meth:`MambaState.page_bytes`:
    conv state in ``--mamba-cache-dtype`` else the model dtype, SSM state in
    ``--mamba-ssm-cache-dtype``, else config.json's ``mamba_ssm_dtype`` (Qwen3.5) /
    ``mamba_ssm_cache_dtype`` (Nemotron-H, default float32), else the conv dtype;
    the conv state keeps ``num_speculative_tokens`` more steps), ``align = max(16, block_size)``;
    ``block = align * cdiv(mamba_page, align * page_1_token)`` rounded up to 16,
    and vLLM keeps the larger of that and ``block_size``. Returns
    ``(block_size, how)``: ``how`` shows the numbers. Raises ``ValueError`` if TP
    does not divide the state.
    """
    m = shape.mamba
    if m is None:
        return None
    hk = max(1, shape.num_key_value_heads // tp)
    if is_turboquant(kv_cache_dtype):
        per_head, what = get_spec(kv_cache_dtype).slot_bytes(shape.head_dim), f"{kv_cache_dtype} slot"
    else:
        per_head, what = 2 * shape.head_dim * dtype.itemsize, "K+V"
    page1 = per_head * hk
    conv = dtype if mamba_cache_dtype == "auto" else parse_dtype(mamba_cache_dtype)
    want = mamba_ssm_cache_dtype if mamba_ssm_cache_dtype != "auto" else m.ssm_dtype
    ssm = parse_dtype(want) if want else conv
    mamba = m.page_bytes(tp, conv.itemsize, ssm.itemsize, num_speculative_tokens)
    align = max(TQ_KERNEL_BLOCK, block_size)
    block = round_up(align * cdiv(mamba, align * page1), TQ_KERNEL_BLOCK)
    out = max(block, block_size)
    how = (f"derived: attention page >= {m.kind} state page (vLLM _align_hybrid_block_size): "
           f"{mamba:,} B state / ({per_head} B {what} x {hk} KV heads = {page1} B per token), "
           f"in multiples of {align} -> {block}")
    return out, how


def apply_hybrid_block(shape: ModelShape, d: DeploymentDraft, given: Mapping[str, Any]) -> None:
    """A hybrid model's attention block size on ``d`` (:func:`hybrid_attention_block_size`), with its notes."""
    if shape.hybrid is None:
        return
    layers = ", ".join(map(str, shape.attention_layers[:4])) + (", ..." if len(shape.attention_layers) > 4 else "")
    d.note(NoteKind.DERIVED, f"hybrid model ({shape.hybrid}): {shape.num_attention_layers} attention layers of "
           f"{shape.num_hidden_layers} ({layers}); KV per token counts only those", "num_hidden_layers")
    user = d.get("block_size")
    try:
        res = hybrid_attention_block_size(shape, kv_cache_dtype=d.get("kv_cache_dtype", "auto"), dtype=d.get("dtype"),
                                          tp=d.get("tensor_parallel_size", 1), block_size=user or 16,
                                          mamba_cache_dtype=given.get("mamba_cache_dtype") or "auto",
                                          mamba_ssm_cache_dtype=given.get("mamba_ssm_cache_dtype") or "auto",
                                          num_speculative_tokens=d.get("num_speculative_tokens", 0))
    except ValueError as e:
        raise VllmArgsError(f"{shape.path}: {e}") from None
    if res is None:
        if user is None:
            d.note(NoteKind.NOT_MODELLED, "hybrid model without a Mamba state tqlab can size: vLLM enlarges the "
                   "attention block; pass --block-size with the size vLLM logs", "block_size")
        return
    block, how = res
    if user is None or block != user:
        d.set("block_size", block, how)
        if user is not None:
            d.note(NoteKind.CHANGED, f"--block-size {user} raised to {block} as vLLM does for hybrid models", "block_size")


def _gdn_note(gdn: bool) -> str:
    if not gdn:
        return ""
    return ("; modelled as with FlashInfer's GDN prefill, which saves the state inside the last chunk "
            "(with the Triton GDN prefill vLLM also stops the last chunk at the prompt's last block boundary); "
            "with FlashInfer vLLM also rounds the block to a multiple of its 64-token checkpoint alignment "
            "(Platform._align_hybrid_block_size in \"align\" mode), not modelled: pass --block-size with the "
            "size vLLM logs")


def apply_mamba_split(given: Mapping[str, Any], d: DeploymentDraft, *, gdn: bool = False) -> None:
    """``mamba_block_aligned_split`` of a hybrid model as vLLM 0.33 decides it (``d`` holds the final block size,
    ``max_num_batched_tokens`` and ``enable_chunked_prefill``).

    vLLM splits when ``Scheduler.need_mamba_block_aligned_split`` (Mamba layers and
    ``cache_config.mamba_cache_mode == "align"``, ``vllm/v1/core/sched/scheduler.py`` ``Scheduler.__init__``);
    ``MambaModelConfig.verify_and_update_config`` (``vllm/model_executor/models/config.py``, run for every
    hybrid through ``HybridAttentionMambaModelConfig`` by ``VllmConfig.try_verify_and_update_config``) sets
    "align" with prefix caching on and "none" with it off; prefix caching defaults to on for generative
    hybrids (``EngineArgs._set_default_chunked_prefill_and_prefix_caching_args``,
    ``ModelConfig.is_prefix_caching_supported``). ``--mamba-cache-mode`` (choices align/none) is deprecated
    and never reaches ``CacheConfig`` (``EngineArgs.create_engine_config``). Prefix caching with chunked
    prefill off: vLLM asserts, so :class:`VllmArgsError`. A block above ``max_num_batched_tokens``: vLLM
    advances the prefill in sub-block chunks, not modelled: left off, with a note.
    """
    mode = given.get("mamba_cache_mode")
    if mode is not None:
        d.note(NoteKind.IGNORED, f"--mamba-cache-mode {mode}: deprecated in vLLM 0.33 and ignored "
               "(EngineArgs.create_engine_config does not pass it on); the Mamba cache mode follows "
               "--enable-prefix-caching")
    if given.get("enable_prefix_caching") is False:
        d.set(SPLIT, False, "flag --no-enable-prefix-caching: mamba_cache_mode \"none\" "
                            "(vLLM MambaModelConfig.verify_and_update_config), no block-aligned split")
        return
    how = ("flag --enable-prefix-caching" if given.get("enable_prefix_caching")
           else "prefix caching on by default for a generative hybrid model")
    if not d.get("enable_chunked_prefill", True):
        raise VllmArgsError("a hybrid model with prefix caching on needs chunked prefill: vLLM 0.33 asserts 'Chunked "
                            "prefill is required for Mamba prefix caching' (MambaModelConfig.verify_and_update_config); "
                            "add --no-enable-prefix-caching or drop --no-enable-chunked-prefill")
    block, mbt = d.get("block_size", 16), d.get("max_num_batched_tokens")
    chunk = step_token_budget(mbt, d.get("max_num_scheduled_tokens"))
    what = "max_num_batched_tokens" if chunk == mbt else "max_num_scheduled_tokens"
    if block > chunk:  # 16: vLLM's default block
        d.set(SPLIT, False, f"derived: off in tqlab: block_size {block} > {what} {chunk}, "
                            "vLLM's sub-block prefill chunks are not modelled")
        d.note(NoteKind.NOT_MODELLED, f"{how}: vLLM 0.33 splits prefills on Mamba block boundaries (mamba_cache_mode "
               f"\"align\", Scheduler._mamba_block_aligned_split), but with block_size {block} > {what} {chunk} "
               "it advances the prefill in sub-block chunks, which tqlab does not model "
               "(mamba_block_aligned_split left off): the first failing prompt may differ", SPLIT)
        return
    d.set(SPLIT, True, f"derived: {how} -> mamba_cache_mode \"align\" (vLLM MambaModelConfig.verify_and_update_config): "
                       "Scheduler._mamba_block_aligned_split ends every prefill chunk but a prompt's last on a block "
                       "boundary")
    d.note(NoteKind.DERIVED, f"mamba_block_aligned_split ({how}): vLLM 0.33 ends every prefill chunk but a prompt's "
           f"last on a multiple of block_size {block} (Scheduler._mamba_block_aligned_split)" + _gdn_note(gdn), SPLIT)
