"""Model fields that size workspace consumers beyond plain attention: MLA, the sparse indexer, MoE.

Names are ``config.json``'s (and vLLM's): vLLM 0.33 reads them in ``vllm/config/model.py``
(``ModelConfig.get_head_size``: an MLA model's head size is ``kv_lora_rank + qk_rope_head_dim``,
576 for DeepSeek-V3; ``is_deepseek_mla``), in ``vllm/model_executor/models/deepseek_v2.py``
(``DeepseekV2MLAAttention``: ``qk_nope_head_dim``, ``v_head_dim``, ``q_lora_rank``; the indexer's
``index_topk``, ``index_head_dim``, ``index_n_heads``) and in the fused-MoE layer
(``n_routed_experts``/``num_experts``, ``num_experts_per_tok``, ``moe_intermediate_size``,
``n_shared_experts``). :class:`tqlab.core.config.EngineConfig` holds one of each (or ``None``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

__all__ = ["IndexerFields", "MLAFields", "MoEFields", "arch_from_dict"]


def _check_ints(obj: object, names: tuple[str, ...], *, minimum: int = 1, optional: tuple[str, ...] = ()) -> None:
    for name in names:
        v = getattr(obj, name)
        if v is None and name in optional:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise ValueError(f"{type(obj).__name__}.{name} must be an int >= {minimum}, got {v!r}")


@dataclass(frozen=True)
class MLAFields:
    """Multi-head latent attention (DeepSeek-V2/V3 style), config.json names.

    ``head_size`` (vLLM's MLA head size, the KV-cache row) = ``kv_lora_rank + qk_rope_head_dim``;
    ``qk_head_dim`` (the prefill query/key head) = ``qk_nope_head_dim + qk_rope_head_dim``.
    DeepSeek-V3: 512, 64, 128, 128, 1536 -> head_size 576, qk_head_dim 192.
    """

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None

    def __post_init__(self) -> None:
        _check_ints(self, ("kv_lora_rank", "qk_nope_head_dim", "v_head_dim"))
        _check_ints(self, ("qk_rope_head_dim",), minimum=0)
        _check_ints(self, ("q_lora_rank",), optional=("q_lora_rank",))

    @property
    def head_size(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True)
class IndexerFields:
    """The sparse attention indexer (DeepSeek-V3.2): ``index_topk`` (2048), ``index_head_dim`` (128), ``index_n_heads`` (64)."""

    index_topk: int
    index_head_dim: int
    index_n_heads: int

    def __post_init__(self) -> None:
        _check_ints(self, ("index_topk", "index_head_dim", "index_n_heads"))


@dataclass(frozen=True)
class MoEFields:
    """A mixture-of-experts block.

    ``num_experts`` (routed; config.json ``num_experts`` or ``n_routed_experts``),
    ``num_experts_per_tok`` (top-k), ``moe_intermediate_size`` (one expert's intermediate size, before
    tensor parallelism), ``hidden_size`` (K, the MoE input width), ``n_shared_experts`` (0: none; shared
    experts run as a plain MLP outside the fused-MoE workspace), ``quantization`` (``None`` for
    unquantized bf16/fp16 weights, else config.json's ``quantization_config.quant_method``),
    ``activation`` (``silu``: gated, so ``w1`` is ``2 * intermediate`` wide).
    """

    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    hidden_size: int
    n_shared_experts: int = 0
    quantization: str | None = None
    activation: str = "silu"

    def __post_init__(self) -> None:
        _check_ints(self, ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "hidden_size"))
        _check_ints(self, ("n_shared_experts",), minimum=0)
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(
                f"MoEFields.num_experts_per_tok ({self.num_experts_per_tok}) > num_experts ({self.num_experts})"
            )


_KINDS = {"mla": MLAFields, "indexer": IndexerFields, "moe": MoEFields}


def arch_from_dict(kind: str, value: Any) -> Any:
    """``value`` as the dataclass for ``kind`` (``mla``, ``indexer``, ``moe``): passes instances and ``None``
    through, builds from a dict (a preset's JSON). Raises ``ValueError`` naming the field for anything else."""
    cls = _KINDS[kind]
    if value is None or isinstance(value, cls):
        return value
    if isinstance(value, dict):
        known = {f.name for f in fields(cls)}
        bad = sorted(set(value) - known)
        if bad:
            raise ValueError(f"{kind}: unknown field(s) {', '.join(bad)}; known: {', '.join(sorted(known))}")
        return cls(**value)
    raise ValueError(f"{kind} must be None, a dict or a {cls.__name__}, got {value!r}")


def arch_to_dict(value: Any) -> dict[str, Any] | None:
    """The JSON form of an :class:`MLAFields`/:class:`IndexerFields`/:class:`MoEFields` (``None`` stays ``None``)."""
    return None if value is None else asdict(value)
