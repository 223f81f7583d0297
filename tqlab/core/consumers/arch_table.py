"""Which workspace consumers a deployment's model can reach, read from vLLM's own model code.

The table is ``data/vllm_<ver>_arch_consumers.json``, generated from vLLM's source by
``parity/gen_arch_consumers.py`` (``make parity`` checks it is current): every architecture of
``vllm/model_executor/models/registry.py`` -> its model class -> the layer families its code builds
(``markers``: ``attention``, ``mla_attention``, ``sparse_indexer``, ``fused_moe``,
``dynamic_submodel``), the workspace call sites it reaches directly (``call_sites``, as vLLM's lock
assertion names them) and the ``config.json`` fields it reads for each family (``config_fields``).
:func:`arch_table` is the one loader (one file per vLLM version); :func:`unsized` turns a deployment's
row into the consumers tqlab cannot size, each with one line saying why.

Which *attention* consumers run is not in the table: vLLM's selector picks the backend at start-up
(:func:`tqlab.core.consumers.backends.attention_backend`); the registry's ``active`` rules size those.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqlab.core import vllm_versions

if TYPE_CHECKING:  # pragma: no cover
    from tqlab.core.config import EngineConfig

__all__ = ["DATA_DIR", "EXPERT_COUNT_KEYS", "FAMILY", "arch_row", "arch_table", "expert_count_keys", "previously_supported",
           "reachable_families", "unsized"]

DATA_DIR = Path(__file__).resolve().parents[3] / "data"
DEFAULT_VLLM = None  # the run's version (tqlab.core.vllm_versions.current)

EXPERT_COUNT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts")
"""config.json keys vLLM's model classes read as the routed-expert count (``FusedMoEFactory(num_experts=...)``):
DeepSeek/Nemotron-H ``n_routed_experts``, Qwen-MoE ``num_experts``, Mixtral/MiniMax-M2/gpt-oss/privacy-filter
``num_local_experts`` (``vllm/model_executor/models/mixtral.py`` ``MixtralDecoderLayer``)."""

_MODELLED_SITES = {
    "modular_kernel.py:_allocate_buffers": "fused_moe",
    "sparse_attn_indexer.py:sparse_attn_indexer": "sparse_indexer",
    "indexer_topk.py:forward": "sparse_indexer",  # covered by the indexer's profile reservation (census)
}
"""Call sites the table reaches that a registry entry sizes (through its family's marker)."""

_SITE_REASONS = (
    ("models/deepseek_v4/", "DeepSeek-V4 attention: compressed-KV gather sizes (issue #41700: "
                            "'requires 21.80 MB, current size is 21.62 MB') are not modelled"),
    ("models/deepseek_v41/", "DeepSeek-V4.1 attention (mega-attention, candidate top-k): not modelled"),
    ("model_executor/layers/mamba/gdn/", "Qwen GDN state checkpoints (model-specific spec): not modelled"),
    ("model_executor/layers/sparse_mqa_indexer.py", "MXFP4 / MQA sparse indexer gathers: not modelled"),
    ("model_executor/layers/quantization/utils/marlin_utils.py",
     "Marlin quantized GEMM locks (persistent, keyed by CUDA stream): not modelled"),
    ("models/", "model-specific workspace call site: not modelled"),
)


def arch_table(vllm: "str | None" = DEFAULT_VLLM) -> dict[str, Any]:
    """The architecture -> consumers table of vLLM ``vllm`` (``"0.34"``; None: the run's version,
    :func:`tqlab.core.vllm_versions.current`): the JSON of
    ``data/vllm_<major>_<minor>_arch_consumers.json`` (keys ``provenance``, ``vllm_version``, ``tables``,
    ``markers``, ``architectures``), at the path :mod:`tqlab.core.vllm_versions` names. Raises ``ValueError`` (one
    line) for a version tqlab does not model or one with no table."""
    return _arch_table(vllm_versions.get(vllm).name)  # ValueError (one line) for a version tqlab does not model


@lru_cache(maxsize=None)
def _arch_table(vllm: str) -> dict[str, Any]:
    path = vllm_versions.get(vllm).architectures_file
    if not path.is_file():
        raise ValueError(f"no architecture table for vLLM {vllm} ({path.name}): run parity/gen_arch_consumers.py "
                         "in that version's parity environment")
    return json.loads(path.read_text(encoding="utf-8"))


def arch_row(architecture: str, vllm: "str | None" = DEFAULT_VLLM) -> dict[str, Any] | None:
    """The table's row for ``architecture`` (``config.json`` ``architectures[0]``), or None when vLLM's registry
    does not list it."""
    return arch_table(vllm)["architectures"].get(architecture)


def expert_count_keys(architecture: str | None, vllm: "str | None" = DEFAULT_VLLM) -> tuple[str, ...]:
    """The :data:`EXPERT_COUNT_KEYS` the architecture's model code reads (all of them for an unknown one); none
    for an architecture whose class builds no fused MoE (a ``num_local_experts`` in a Llama config.json is not
    read by ``LlamaForCausalLM``, so it neither adds experts nor makes their other fields required)."""
    row = arch_row(architecture, vllm) if architecture else None
    if row is not None and row.get("markers") is not None and not _builds_moe(row):
        return ()
    read = set((row or {}).get("config_fields", {}).get("fused_moe", []))
    keys = tuple(k for k in EXPERT_COUNT_KEYS if k in read)
    return keys or EXPERT_COUNT_KEYS


def _builds_moe(row: dict[str, Any]) -> bool:
    """Whether a table row's class can build fused MoE: the marker, the experts' call site, or layers chosen at
    run time (``dynamic_submodel``: its language model may)."""
    markers = set(row.get("markers") or ())
    return (bool(markers & {"fused_moe", "dynamic_submodel"})
            or any(s["consumer"] == "modular_kernel.py:_allocate_buffers" for s in row.get("call_sites", ())))


FAMILY = {
    "turboquant_decode": "attention", "turboquant_continuation": "attention", "flash_attn_dcp": "attention",
    "fused_moe": "fused_moe", "flashmla_sparse": "mla_attention", "mla_prefill_trtllm_ragged": "mla_attention",
    "mla_prefill_flashinfer": "mla_attention", "triton_mla_logits": "mla_attention", "sparse_indexer": "sparse_indexer",
}
"""Registry name -> the layer family (table marker) whose layers make its requests: the attention backend's
consumers run where vLLM's ``Attention`` layer runs (the selector picks the backend), the MLA backends' where
``MLAAttention`` runs, the indexer where ``SparseAttnIndexer`` runs, the experts' where ``FusedMoEFactory`` runs."""


def previously_supported(architecture: str, vllm: "str | None" = DEFAULT_VLLM) -> str | None:
    """The last vLLM version that ran ``architecture`` when vLLM ``vllm`` refuses it by name
    (``model_executor/models/registry.py`` ``_PREVIOUSLY_SUPPORTED_MODELS``, e.g. ``MPTForCausalLM`` -> ``"0.28.0"``),
    else None."""
    return arch_table(vllm).get("previously_supported", {}).get(architecture)


def reachable_families(config: "EngineConfig", vllm: "str | None" = DEFAULT_VLLM) -> frozenset[str] | None:
    """The layer families ``config.architecture``'s model class builds (markers, and the families of the
    modelled call sites it reaches), or None when the table cannot restrict anything (no architecture, one
    outside the registry, layers chosen at run time): then every consumer the fields activate is sized."""
    row = arch_row(config.architecture, vllm) if config.architecture else None
    if row is None or row.get("markers") is None or "dynamic_submodel" in row["markers"]:
        return None
    sites = {_MODELLED_SITES[s["consumer"]] for s in row["call_sites"] if s["consumer"] in _MODELLED_SITES}
    return frozenset(row["markers"]) | sites


def _site_reason(path: str) -> str:
    return next(r for prefix, r in _SITE_REASONS if path.startswith(prefix) or prefix == "models/")


def unsized(config: "EngineConfig", vllm: "str | None" = DEFAULT_VLLM) -> list[dict[str, str]]:
    """``[{"consumer", "reason"}]``: the consumers ``config.architecture``'s model code reaches that tqlab cannot size.

    ``architecture`` None (a deployment described by its fields, not by a config.json): nothing from the table.
    Otherwise: an architecture not in vLLM's registry, or one whose layers are built at run time (the
    Transformers backend, ``init_vllm_registered_model``), gives one entry; the fused-MoE family is unsized when
    ``config.moe`` could not be read (the expert fields the class reads are absent); every reached call site
    that no registry entry models gives one entry (a Marlin lock only with a quantized MoE). The fused-MoE
    experts class's own limits (quantized, SM100, DP+EP) are :data:`tqlab.core.consumers.registry.UNMODELLED`'s.
    """
    arch = config.architecture
    if arch is None:
        return []
    if not arch:
        return [{"consumer": "model class", "reason": "config.json names no architectures: vLLM cannot pick a model "
                 "class, so tqlab cannot tell which workspace consumers run"}]
    row = arch_row(arch, vllm)
    if row is None:
        return [{"consumer": f"model class of {arch}", "reason": f"{arch} is not in vLLM {vllm_versions.get(vllm).name}'s model registry "
                 "(vllm/model_executor/models/registry.py): tqlab cannot tell which workspace consumers its layers reach"}]
    if row.get("markers") is None:
        return [{"consumer": f"{row['module']}.{row['class']}", "reason": row.get("why") or "layers unknown statically"}]
    out = []
    markers = set(row["markers"])
    if "dynamic_submodel" in markers:
        out.append({"consumer": f"{row['class']} (init_vllm_registered_model)",
                    "reason": "its language model is chosen from the config at run time: its consumers are not in "
                              "the table"})
    sites = {s["consumer"]: s["path"] for s in row["call_sites"]}
    if ("fused_moe" in markers or "modular_kernel.py:_allocate_buffers" in sites) and config.moe is None:
        keys = expert_count_keys(arch, vllm)
        out.append({"consumer": "modular_kernel.py:_allocate_buffers",
                    "reason": f"{arch} builds fused MoE but the config gives no expert count ({' / '.join(keys)}) "
                              "with num_experts_per_tok: unread field"})
    quantized_moe = config.moe is not None and config.moe.quantization is not None
    for site, path in sorted(sites.items()):
        if site in _MODELLED_SITES or (path.endswith("marlin_utils.py") and not quantized_moe):
            continue
        out.append({"consumer": site, "reason": _site_reason(path)})
    return out
