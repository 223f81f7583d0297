"""tqlab's `vllm serve` reading vs vLLM 0.33's own parser and page sizes (issue 11 section 5, issue 14).

* The checked-in ``tqlab/vllm/vllm_0_33_flags.json`` equals what
  ``parity/gen_vllm_flags.py`` generates from this vLLM (``make_arg_parser`` =
  ``FrontendArgs`` + ``EngineArgs.add_cli_args`` on a ``FlexibleArgumentParser``).
* Serve lines: :func:`tqlab.vllm.deployment.parse_serve_args` gives the
  same values as ``vllm serve``'s parser, and refuses the lines it refuses.
* Hybrid block size inputs: the Mamba state page (:meth:`MambaState.page_bytes`)
  equals vLLM's ``MambaSpec.page_size_bytes`` from ``MambaStateShapeCalculator``,
  and the TurboQuant slot equals ``TurboQuantConfig.slot_size_aligned``.
"""

from __future__ import annotations

import contextlib
import io
import shlex
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_vllm_flags

from tqlab.turboquant.spec import get_spec
from tqlab.vllm.hf_config import read_hf_config
from tqlab.vllm.deployment import FLAGS_FILE, VllmArgsError, parse_serve_args


def test_checked_in_flag_table_is_what_vllm_generates():
    """The installed release's table (``VllmVersion.flags_file``: ``vllm_0_33_flags.json``, ``vllm_0_34_flags.json``)."""
    import vllm

    from tqlab.core import vllm_versions

    table = vllm_versions.get(".".join(vllm.__version__.split(".")[:2])).flags_file
    assert table.read_text() == gen_vllm_flags.render(gen_vllm_flags.generate())
    if table.name == "vllm_0_33_flags.json":
        assert table == FLAGS_FILE  # what tqlab.vllm.flags reads today


@pytest.fixture(scope="module")
def vllm_parse():
    gen_vllm_flags.generate()  # sets the CPU platform as `vllm` main() does
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    root = FlexibleArgumentParser(description="vLLM CLI")
    ServeSubcommand().subparser_init(root.add_subparsers(required=False, dest="subparser"))

    def parse(line: str):
        with contextlib.redirect_stderr(io.StringIO()):
            try:
                return vars(root.parse_args(shlex.split(line)))
            except SystemExit:
                return None
    return parse


def _plain(v):
    """vLLM's parsed value as plain data (config dataclasses -> their given fields)."""
    if hasattr(v, "value") and not isinstance(v, (int, str)):
        return v.value
    return v


LINES = [
    "serve M --enable-lora -tp 8", "serve M --max-model-len 128k", "serve M --max-model-len=128K",
    "serve M --max-model-len 25.6k", "serve M --max-model-len auto", "serve M --max-model-len ' 1_000 '",
    "serve M --max_num_seqs=4 -tp=2", "serve M --max-num-batched-tokens 2k", "serve M --no-enable-chunked-prefill",
    "serve M --disable-chunked-prefill", "serve M --cudagraph-capture-sizes 1 2 4", "serve M -O3", "serve M -O 0",
    "serve M --max-num-seq 4", "serve M --tensor-parallel 2", "serve --enable-chunked-prefill false",
    "serve M --max-model-len -5", "serve M --max-model-len 3k --max-model-len 5", "serve M --enforce-eager --port 8000",
    """serve M --speculative-config '{"method":"mtp","num_speculative_tokens":3}'""",
    "serve M --speculative-config None",
]
BAD = [
    "serve M --max-num-sqs 4", "serve M --max-num 4", "serve M --enable-chunked-prefill false",
    "serve M --max-model-len infk", "serve M --max-model-len 1e30k", "serve M --max-model-len 1.5K",
    "serve M --max-num-seqs 4k", "serve M --cudagraph-capture-sizes 1,2,4", "serve M --attention-config 5",
    "serve M --enable-lora=false", "serve M --max-model-len", "serve M --compilation-config 3",
    "serve M --compilation-config None", "serve M --max-num-seqs None",
]


@pytest.mark.parametrize("line", LINES)
def test_serve_line_values_equal_vllms(vllm_parse, line):
    ours, _ = parse_serve_args("vllm " + line)
    theirs = vllm_parse(line)
    assert theirs is not None
    assert {k: _plain(theirs[k]) for k in ours} == ours


@pytest.mark.parametrize("line", ["serve M -cc.cudagraph_capture_sizes '[1,2]' -cc.cudagraph_mode FULL",
                                  """serve M --compilation-config '{"cudagraph_capture_sizes":[1,2]}'""",
                                  "serve M -ac.tq_max_kv_splits_for_cuda_graph 8"])
def test_json_configs_equal_vllms(vllm_parse, line):
    ours, _ = parse_serve_args("vllm " + line)
    theirs = vllm_parse(line)
    for dest, given in ours.items():
        if dest == "model_tag":
            continue
        obj = theirs[dest]
        for key, value in given.items():
            got = obj[key] if isinstance(obj, dict) else getattr(obj, key)
            assert (got.name if hasattr(got, "name") else got) == value, (dest, key)


@pytest.mark.parametrize("line", BAD)
def test_lines_vllm_refuses_we_refuse(vllm_parse, line):
    assert vllm_parse(line) is None
    with pytest.raises(VllmArgsError):
        parse_serve_args("vllm " + line)


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("ssm", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("spec", [0, 3])
def test_mamba_pages_equal_vllms(tp, ssm, spec):
    from vllm.model_executor.layers.mamba.mamba_utils import (
        MambaStateShapeCalculator as Calc,
    )
    from vllm.v1.kv_cache_interface import MambaSpec

    gdn = read_hf_config({"text_config": {
        "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256, "num_hidden_layers": 64,
        "full_attention_interval": 4, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
        "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4}})
    shapes = Calc.gated_delta_net_state_shape(tp, 16, 48, 128, 128, 4, num_spec=spec)
    want = MambaSpec(shapes=shapes, dtypes=(torch.bfloat16, ssm), block_size=-1).page_size_bytes
    assert gdn.mamba.page_bytes(tp, 2, ssm.itemsize, spec) == want
    m2 = read_hf_config({"num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128, "num_hidden_layers": 4,
                         "hybrid_override_pattern": "M*ME", "mamba_num_heads": 128, "mamba_head_dim": 64,
                         "n_groups": 8, "ssm_state_size": 128, "conv_kernel": 4})
    shapes = Calc.mamba2_state_shape(tp, 128 * 64, 8, 128, 64, 128, 4, num_spec=spec)
    want = MambaSpec(shapes=shapes, dtypes=(torch.bfloat16, ssm), block_size=-1).page_size_bytes
    assert m2.mamba.page_bytes(tp, 2, ssm.itemsize, spec) == want


@pytest.mark.parametrize("preset", ["turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc"])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_turboquant_slot_equals_vllms(preset, d):
    from vllm.model_executor.layers.quantization.turboquant.config import (
        TurboQuantConfig,
    )

    assert get_spec(preset).slot_bytes(d) == TurboQuantConfig.from_cache_dtype(preset, d).slot_size_aligned


# --------------------------------------------------------------------------- #
# The hybrid attention block size: vLLM's own _align_hybrid_block_size        #
# --------------------------------------------------------------------------- #

GDN = {"linear_num_key_heads": 16, "linear_num_value_heads": 48, "linear_key_head_dim": 128,
       "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4}
MAMBA2 = {"mamba_num_heads": 128, "mamba_head_dim": 64, "n_groups": 8, "ssm_state_size": 128, "conv_kernel": 4}


def _vllm_hybrid_block(kind, hf_text, *, kv, tp, hk, d, block, spec):
    """Run ``Platform._align_hybrid_block_size`` on a minimal config; the model classes are vLLM's
    (Qwen3Next for Gated DeltaNet: the same ``get_mamba_state_shape_from_config`` as Qwen3.5, whose
    module needs torchvision; NemotronH for Mamba2), the SSM dtype set by vLLM's own config hooks."""
    import contextlib
    import types

    import vllm.config.vllm as cv
    from vllm.model_executor.models import ModelRegistry
    from vllm.model_executor.models.config import (
        NemotronHForCausalLMConfig,
        Qwen3_5ForConditionalGenerationConfig,
    )
    from vllm.model_executor.models.nemotron_h import NemotronHForCausalLM
    from vllm.model_executor.models.qwen3_next import Qwen3NextForCausalLM
    from vllm.platforms.interface import Platform
    from vllm.v1.attention.backends.turboquant_attn import TurboQuantAttentionBackend

    ns = types.SimpleNamespace
    hf = ns(**hf_text)
    mc = ns(model_impl="auto", use_mla=False, dtype=torch.bfloat16, architecture="X", hf_text_config=hf, hf_config=hf,
            get_num_kv_heads=lambda p: max(1, hk // p.tensor_parallel_size), get_head_size=lambda: d)
    cc = ns(cache_dtype=kv, kv_cache_dtype_skip_layers=None, block_size=block, mamba_cache_mode="none",
            mamba_cache_dtype="auto", mamba_ssm_cache_dtype="auto", mamba_page_size_padded=None, use_replayssm=False)
    cfg = ns(model_config=mc, cache_config=cc, parallel_config=ns(tensor_parallel_size=tp),
             speculative_config=ns(num_speculative_tokens=spec) if spec else None, num_speculative_tokens=spec,
             use_flashinfer_replayssm=False)  # vLLM 0.34's VllmConfig property (cache_config.use_replayssm is False)
    if kind == "gdn":
        Qwen3_5ForConditionalGenerationConfig.verify_and_update_config(cfg)
    else:
        NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype(cache_config=cc, hf_config=hf)
    model_cls = Qwen3NextForCausalLM if kind == "gdn" else NemotronHForCausalLM
    patches = [(Platform, "_find_non_ssm_backends", classmethod(lambda cls, c: [TurboQuantAttentionBackend])),
               (cv, "set_current_vllm_config", lambda c: contextlib.nullcontext()),
               (ModelRegistry, "resolve_model_cls", lambda *a, **k: (model_cls, "X"))]
    saved = [(o, n, o.__dict__[n] if isinstance(o, type) else getattr(o, n)) for o, n, _ in patches]
    try:
        for o, n, v in patches:
            setattr(o, n, v)
        Platform._align_hybrid_block_size(cfg, TurboQuantAttentionBackend)
    finally:
        for o, n, v in saved:
            setattr(o, n, v)
    return cc.block_size


@pytest.mark.parametrize("kind", ["gdn", "mamba2"])
@pytest.mark.parametrize("kv", ["turboquant_k8v4", "turboquant_4bit_nc", "turboquant_3bit_nc"])
@pytest.mark.parametrize("tp, spec, block", [(1, 0, 16), (2, 0, 16), (1, 3, 16), (4, 1, 64), (1, 0, 4096)])
def test_hybrid_block_size_equals_vllms(kind, kv, tp, spec, block):
    from tqlab.vllm.deployment import deployment_from_vllm

    hk, d = (4, 256) if kind == "gdn" else (8, 128)
    text = {"num_attention_heads": 32, "num_key_value_heads": hk, "head_dim": d, "num_hidden_layers": 8,
            "max_position_embeddings": 65536, "torch_dtype": "bfloat16"}
    top: dict = {}
    if kind == "gdn":
        text.update(GDN, full_attention_interval=4, mamba_ssm_dtype="float32")
    else:  # vLLM's float32 SSM default follows the architecture (MODELS_CONFIG_MAP), as in a real Nemotron-H config
        text.update(MAMBA2, hybrid_override_pattern="M*M-M*M-")
        top["architectures"] = ["NemotronHForCausalLM"]
    line = f"vllm serve M -tp {tp} --kv-cache-dtype {kv} --block-size {block}"
    if spec:
        line += f" --speculative-config '{{\"num_speculative_tokens\": {spec}}}'"
    ours = deployment_from_vllm(line, {**top, "text_config": text}).config.block_size
    assert ours == _vllm_hybrid_block(kind, text, kv=kv, tp=tp, hk=hk, d=d, block=block, spec=spec)


def test_report_43357_block_is_2080_in_vllm_itself():
    """vllm-project/vllm#43357 (Qwen3.6-27B, turboquant_k8v4, TP 1) logs "attention_block_size: 2080"."""
    text = {**GDN, "mamba_ssm_dtype": "float32"}
    assert _vllm_hybrid_block("gdn", text, kv="turboquant_k8v4", tp=1, hk=4, d=256, block=16, spec=0) == 2080


def test_config_yaml_equals_vllms(vllm_parse, tmp_path):
    y = tmp_path / "serve.yaml"
    y.write_text("tensor-parallel-size: 4\nmax_model_len: 64k\nenforce-eager: true\nenable-chunked-prefill: false\n"
                 "max-num-seqs: 8\n")
    line = f"serve M --config {y} -tp 2"
    ours, _ = parse_serve_args("vllm " + line)
    theirs = vllm_parse(line)
    assert {k: _plain(theirs[k]) for k in ours} == ours


@pytest.mark.parametrize("layers", [1, 2, 3, 4, 5, 32, 88])
def test_boundary_skip_layers_equal_vllms(layers):
    import types

    from vllm.model_executor.layers.quantization.turboquant.config import TurboQuantConfig

    from tqlab.vllm.deployment import engine_config_kwargs_from_vllm

    mc = types.SimpleNamespace(is_hybrid=False, hf_text_config=types.SimpleNamespace(num_hidden_layers=layers))
    theirs = layers - len(TurboQuantConfig.get_boundary_skip_layers(mc))
    cfg = {"num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": layers,
           "max_position_embeddings": 4096}
    try:
        ours = engine_config_kwargs_from_vllm("vllm serve M --kv-cache-dtype turboquant_4bit_nc", cfg)[0]["num_hidden_layers"]
    except ValueError:
        ours = 0  # every layer kept off TurboQuant: tqlab's one-line "no TurboQuant workspace consumer"
    assert ours == theirs


@pytest.mark.parametrize("line, cls, kwargs, pydantic_type", [
    ("-cc '{\"bogus_key\": 1}'", "CompilationConfig", {"bogus_key": 1}, "unexpected_keyword_argument"),
    ("--attention-config.bogus 1", "AttentionConfig", {"bogus": 1}, "unexpected_keyword_argument"),
    ("--speculative-config '{\"bogus\": 1}'", "SpeculativeConfig", {"bogus": 1}, "unexpected_keyword_argument"),
    ("--speculative-config '{\"method\": \"bogus\", \"num_speculative_tokens\": 2}'", "SpeculativeConfig",
     {"method": "bogus", "num_speculative_tokens": 2}, {"0.33": "literal_error", "0.34": "value_error"}),
])
def test_config_keys_vllm_refuses_are_refused(line, cls, kwargs, pydantic_type):
    """The keys and methods tqlab refuses (``flags._check_config_keys``) are those vLLM's config classes refuse
    (an unknown speculative method: 0.33's ``method`` is a ``Literal``, 0.34 checks it in a validator)."""
    import pydantic
    import vllm
    import vllm.config

    if isinstance(pydantic_type, dict):
        pydantic_type = pydantic_type[".".join(vllm.__version__.split(".")[:2])]
    with pytest.raises(pydantic.ValidationError) as e:
        getattr(vllm.config, cls)(**kwargs)
    assert e.value.errors()[0]["type"] == pydantic_type
    with pytest.raises(VllmArgsError):
        parse_serve_args(f"vllm serve M {line}")
