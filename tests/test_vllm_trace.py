"""tqlab.vllm without vLLM: the tracer on tqlab's manager and on a vLLM-shaped stand-in,
engine-argument parsing, config.json reading and the crash predictor.

The same functions are checked against vLLM's own classes in parity/ (own venv).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tqlab.core.config import EngineConfig
from tqlab.core.reservation import continuation_workspace_shapes, decode_workspace_shapes, plan_bytes, reservation_plan
from tqlab.vllm import WorkspaceTracer, engine_config_from_vllm, parse_engine_args, run_seed_scenario
from tqlab.predict.analysis import safe_max_model_len
from tqlab.predict.analysis import unfixed_locked_bytes as locked_bytes_without_fix
from tqlab.predict.report import DECODE, DEQUANT_CHUNK, SHORT_CHUNK, bug_report_max_num_batched_tokens, chunk_shapes, inspect_vllm
from tqlab.predict.report import consumer_report as predict
from tqlab.core.workspace import WorkspaceLockedError, WorkspaceManager, ubatch_context

MiB = 1 << 20
SEED_TAIL = "requires 2.00 MB, current size is 0.26 MB. Workspace growth is not allowed after locking."
SEED_CMD = (
    "vllm serve /path/to/Nemotron-3-Super-120B-AWQ-4bit --tensor-parallel-size 8 --gpu-memory-utilization 0.92 "
    "--max-num-seqs 4 --max-model-len 131072 --trust-remote-code --enable-expert-parallel "
    "--mamba-ssm-cache-dtype float16 --kv-cache-dtype turboquant_3bit_nc"
)
NEMOTRON_CONFIG = {  # the attention fields of a Nemotron-H style config.json (hybrid: '*' = attention layer)
    "architectures": ["NemotronHForCausalLM"],
    "num_attention_heads": 32,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "hidden_size": 4096,
    "num_hidden_layers": 88,
    "hybrid_override_pattern": "MEMEMEM*E" * 8 + "MEMEMEMEMEMEMEMEM",
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 262144,
}


def seed_config(**kw) -> EngineConfig:
    return EngineConfig.from_preset("nemotron-3-super-120b-a12b", **kw)


def _request(manager, reqs):
    return manager.get_simultaneous(*reqs)


# --------------------------------------------------------------------------- #
# import hygiene                                                              #
# --------------------------------------------------------------------------- #


def test_import_does_not_import_vllm():
    code = "import sys, tqlab.vllm as t; assert 'vllm' not in sys.modules, sorted(m for m in sys.modules if m.startswith('vllm'))"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


# --------------------------------------------------------------------------- #
# tracer on tqlab's manager                                                   #
# --------------------------------------------------------------------------- #


def test_tracer_on_tqlab_manager_records_per_caller_lock_and_violation():
    m = WorkspaceManager("cpu")
    tracer = WorkspaceTracer(m)
    dec = decode_workspace_shapes(4, 4, 128, 32, torch.bfloat16)
    _request(m, dec)
    _request(m, decode_workspace_shapes(2, 4, 128, 32, torch.bfloat16))
    m.get_simultaneous(((10,), torch.float32))  # a second caller: this test function
    m.lock()
    with pytest.raises(WorkspaceLockedError) as e:
        _request(m, continuation_workspace_shapes(4096, 1, 128, 16))
    # attaching did not change the caller the manager itself names
    assert e.value.caller.endswith(":_request")
    assert str(e.value).endswith(SEED_TAIL)
    rep = tracer.report()
    by = {c["caller"].rsplit(":", 1)[1]: c for c in rep["callers"]}
    assert by["_request"] == {
        "caller": by["_request"]["caller"],
        "requests": 3,
        "high_water_bytes": 2 * MiB,
        "last_bytes": 2 * MiB,
        "growths": 1,
        "violations": 1,
        "slots": [0],
        "before_lock_bytes": 268544,  # the decode scratch at max_num_seqs rows
        "after_lock_bytes": 2 * MiB,  # the refused continuation request
        "high_water_phase": "after lock",
    }
    assert by["test_tracer_on_tqlab_manager_records_per_caller_lock_and_violation"]["high_water_bytes"] == 256
    assert by["test_tracer_on_tqlab_manager_records_per_caller_lock_and_violation"]["high_water_phase"] == "before lock"
    assert rep["size_at_lock_bytes"] == [268544]
    (v,) = rep["violations"]
    assert (v["required_bytes"], v["current_bytes"], v["slot"]) == (2 * MiB, 268544, 0)
    assert v["message"] == str(e.value)
    assert "VIOLATION slot 0" in tracer.format() and "0.26 MiB" in tracer.format()
    json.dumps(rep)  # JSON-ready


def test_tracer_detach_restores_the_instance_and_keeps_records():
    m = WorkspaceManager("cpu")
    with WorkspaceTracer(m) as tracer:
        assert tracer.attached and "get_simultaneous" in vars(m)
        m.get_simultaneous(((64,), torch.float32))
    assert not tracer.attached
    assert not {"get_simultaneous", "lock", "unlock"} & set(vars(m))
    m.get_simultaneous(((1024,), torch.float32))  # not recorded any more
    assert tracer.total_requests == 1 and tracer.high_water_bytes() == 256


def test_tracer_records_ubatch_slots_and_unlock():
    m = WorkspaceManager("cpu", 2)
    tracer = WorkspaceTracer(m)
    with ubatch_context(1):
        m.get_simultaneous(((100,), torch.float32))
    m.lock()
    m.unlock()
    assert [r.kind for r in tracer.locks] == ["lock", "unlock"]
    assert tracer.size_at_lock() == (0, 512)
    (c,) = tracer.callers.values()
    assert c.slots == [1]


def test_tracer_bad_input_passes_through_to_the_manager():
    m = WorkspaceManager("cpu")
    tracer = WorkspaceTracer(m)
    with pytest.raises(ValueError, match="negative"):
        m.get_simultaneous(((-1, 4), torch.float32))
    assert tracer.total_requests == 0 and m.sizes_bytes() == [0]


def test_attach_errors():
    with pytest.raises(TypeError, match="cannot trace"):
        WorkspaceTracer(object())
    m = WorkspaceManager("cpu")
    t = WorkspaceTracer(m)
    with pytest.raises(ValueError, match="already attached"):
        t.attach(m)


# --------------------------------------------------------------------------- #
# tracer on a vLLM-shaped manager (the growth path the tracer wraps in vLLM)  #
# --------------------------------------------------------------------------- #


class WorkspaceManager_:  # renamed below to "WorkspaceManager", the name vLLM's caller rule keys on
    """Stand-in with vLLM 0.33's private surface: ``_current_workspaces``,
    ``_get_workspace_id()``, ``_ensure_workspace_size(required_bytes)`` (which
    names the first frame whose qualified name is not ``WorkspaceManager.*``)."""

    def __init__(self, slots=1):
        self._current_workspaces = [None] * slots
        self._locked = False
        self.slot = 0

    def _get_workspace_id(self):
        return self.slot

    def is_locked(self):
        return self._locked

    def lock(self):
        self._locked = True

    def unlock(self):
        self._locked = False

    def get_simultaneous(self, *reqs):
        from tqlab.core.workspace import compute_layout

        lay = compute_layout(reqs)
        buf = self._ensure_workspace_size(lay.total_bytes)
        return [buf[o : o + n].view(dt).view(s) for s, dt, n, o in zip(lay.shapes, lay.dtypes, lay.nbytes, lay.offsets)]

    def _ensure_workspace_size(self, required):
        cur = self._current_workspaces[self.slot]
        size = 0 if cur is None else cur.numel()
        if size < required:
            if self._locked:
                f = sys._getframe(1)
                while f.f_code.co_qualname.startswith("WorkspaceManager."):
                    f = f.f_back
                raise AssertionError(f"locked; caller {f.f_code.co_name}; {required} > {size}")
            self._current_workspaces[self.slot] = torch.empty(required, dtype=torch.uint8)
        return self._current_workspaces[self.slot]


WorkspaceManager_.__name__ = WorkspaceManager_.__qualname__ = "WorkspaceManager"
if sys.version_info >= (3, 11):  # co_qualname: what vLLM's caller rule reads
    for _name, _fn in list(vars(WorkspaceManager_).items()):
        if callable(_fn) and hasattr(_fn, "__code__"):
            _fn.__code__ = _fn.__code__.replace(co_qualname=f"WorkspaceManager.{_name}")
VllmLike = WorkspaceManager_


@pytest.mark.skipif(sys.version_info < (3, 11), reason="co_qualname (vLLM's caller rule) needs Python 3.11")
def test_tracer_on_vllm_shaped_manager_wraps_the_growth_path():
    m = VllmLike(slots=2)
    tracer = WorkspaceTracer(m)
    assert "_ensure_workspace_size" in vars(m)
    _request(m, (((100,), torch.float32),))
    m.slot = 1
    _request(m, (((10,), torch.float32),))
    m.lock()
    with pytest.raises(AssertionError) as e:
        _request(m, (((1000,), torch.float32),))
    assert "caller _request" in str(e.value)  # the wrapper frame is skipped like vLLM's own
    assert tracer.size_at_lock() == (512, 256)
    (c,) = tracer.callers.values()
    assert (c.requests, c.high_water_bytes, c.growths, c.violations, c.slots) == (3, 4096, 2, 1, [0, 1])
    assert tracer.violations[0].current_bytes == 256 and tracer.violations[0].slot == 1
    tracer.detach()
    assert "_ensure_workspace_size" not in vars(m)


# --------------------------------------------------------------------------- #
# the seed scenario on tqlab's manager                                        #
# --------------------------------------------------------------------------- #


def test_seed_scenario_tqlab_unfixed_and_fixed():
    bad = run_seed_scenario(seed_config(), cached_len=4096, fixed=False)
    assert bad.error is not None and bad.error.endswith(SEED_TAIL)
    assert "_continuation_prefill" in bad.error
    assert bad.size_at_lock == (268544,)
    assert bad.trace["violations"][0]["required_bytes"] == 2 * MiB
    good = run_seed_scenario(seed_config(), cached_len=4096, fixed=True)
    assert good.error is None and good.size_at_lock == (64 * MiB,)
    with pytest.raises(ValueError, match="backend"):
        run_seed_scenario(backend="sglang")


# --------------------------------------------------------------------------- #
# engine args and config.json                                                 #
# --------------------------------------------------------------------------- #


def test_parse_seed_command_line():
    args, ignored = parse_engine_args(SEED_CMD)
    assert args == {
        "tensor_parallel_size": 8,
        "max_num_seqs": 4,
        "max_model_len": 131072,
        "kv_cache_dtype": "turboquant_3bit_nc",
        "enable_expert_parallel": True,  # read since issue 19 (the fused-MoE consumer's sharding)
    }
    # real vLLM 0.33 flags that do not size the workspace (the table generated from vLLM; see tests/test_vllm_args.py)
    assert ignored == ["--gpu-memory-utilization", "--mamba-ssm-cache-dtype", "--trust-remote-code"]


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--max-model-len", "128k"], {"max_model_len": 128000}),
        (["--max-model-len=128K"], {"max_model_len": 131072}),
        (["-tp", "2", "--no-enable-chunked-prefill"], {"tensor_parallel_size": 2, "enable_chunked_prefill": False}),
        (["--attention-config", '{"tq_max_kv_splits_for_cuda_graph": 16}'], {"tq_max_kv_splits_for_cuda_graph": 16}),
        ({"max-num-batched-tokens": "8192", "--enable-dbo": True}, {"max_num_batched_tokens": 8192, "enable_dbo": True}),
        (None, {}),
    ],
)
def test_parse_engine_args_forms(args, expected):
    assert parse_engine_args(args)[0] == expected


def test_parse_engine_args_bad_value_names_it():
    with pytest.raises(ValueError, match="--max-model-len: invalid human_readable_int_or_auto value: 'lots'"):
        parse_engine_args("--max-model-len lots")
    with pytest.raises(ValueError, match="--enable-dbo must be true or false"):
        parse_engine_args({"enable_dbo": "maybe"})


def test_engine_config_from_seed_deployment_matches_the_preset():
    cfg, notes = engine_config_from_vllm(SEED_CMD + " --max-num-batched-tokens 4096", NEMOTRON_CONFIG)
    preset = seed_config()
    for f in ("num_attention_heads", "num_key_value_heads", "head_dim", "num_hidden_layers", "tensor_parallel_size",
              "max_model_len", "max_num_seqs", "max_num_batched_tokens", "kv_cache_dtype", "dtype", "block_size"):
        assert getattr(cfg, f) == getattr(preset, f), f
    assert any("hybrid model" in n for n in notes)


def test_engine_config_defaults_and_text_config(tmp_path):
    raw = {"text_config": {"num_attention_heads": 16, "hidden_size": 2048, "max_position_embeddings": 32768,
                           "torch_dtype": "float32"}}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    cfg, notes = engine_config_from_vllm("--kv-cache-dtype turboquant_4bit_nc", tmp_path)
    assert (cfg.num_key_value_heads, cfg.head_dim, cfg.max_model_len) == (16, 128, 32768)
    assert (cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.dtype) == (256, 2048, torch.bfloat16)
    cfg, _ = engine_config_from_vllm({}, tmp_path, gpu_memory_gib=141, usage="llm")
    assert (cfg.max_num_seqs, cfg.max_num_batched_tokens) == (1024, 16384)
    with pytest.raises(ValueError, match="no such file"):
        engine_config_from_vllm({}, tmp_path / "missing.json")
    with pytest.raises(ValueError, match="num_attention_heads"):
        engine_config_from_vllm({}, {"hidden_size": 10})


# --------------------------------------------------------------------------- #
# predictor                                                                   #
# --------------------------------------------------------------------------- #


def test_chunk_shapes_paths():
    cfg = seed_config()
    assert chunk_shapes(cfg, 0, 4096) == ("prefill", None)
    assert chunk_shapes(cfg, 4096, 128) == (SHORT_CHUNK, None)  # vLLM 0.33: own buffers, no workspace
    assert chunk_shapes(cfg, 4096, 129) == (DEQUANT_CHUNK, continuation_workspace_shapes(4096, 1, 128, 16))


def test_predict_seed_deployment():
    cfg = seed_config()
    p = predict(cfg, [4096, 4224, 4225, 8192])
    assert p.locked_unfixed == locked_bytes_without_fix(cfg) == 268544
    assert p.locked_fixed == plan_bytes(reservation_plan(cfg)) == 64 * MiB
    verdicts = [(r.prompt_tokens, r.crashes_unfixed, r.crashes_fixed, r.need_bytes) for r in p.requests]
    assert verdicts == [
        (4096, False, False, 67328),  # one chunk, then decode: (1,4,32,129) f32 + (1,4,128) bf16 + (1,4) f32
        (4224, False, False, 67328),  # second chunk has 128 new tokens: decode kernel, no workspace
        (4225, True, False, 2 * MiB),  # 129 new tokens after 4096 cached: the seed's 2.00 MB
        (8192, True, False, 2 * MiB),
    ]
    assert p.first_failing_prompt == 4225
    # prompts up to 4224 tokens survive; vLLM 0.33's input processor refuses a prompt of max_model_len
    # tokens, so max_model_len 4225 (not 4224, as this test said before) is the largest safe one
    assert p.safe_max_model_len_alone == 4225
    # any chunking: dequant of c cached tokens needs 512*round_up(c, 16) bytes <= 268544 -> c <= 512
    # and a step (or a prefix-cache hit) leaves whole 16-token blocks cached on this hybrid preset
    # (Scheduler._mamba_block_aligned_split): 528 cached + 129 new is the first request that overflows
    assert p.safe_max_model_len_any_schedule == 528 + 129 - 1
    assert p.fixed_safe_any_schedule == cfg.max_model_len
    text = p.format()
    assert "CRASH without the fix, ok with it" in text and "4225 tokens" in text


def test_predict_tqlab_engine_model_and_measured_lock():
    cfg = seed_config()
    # (the short_chunks_use_workspace variant -- short chunks taking workspace decode views -- modelled
    # neither vLLM 0.33 nor tqlab's engine and was removed with the move to tqlab.predict.analysis)
    p = predict(cfg, [4101])
    assert not p.requests[0].crashes_unfixed and p.first_failing_prompt == 4225
    q = predict(cfg, [8192], locked_bytes=2 * MiB)
    assert q.locked_source == "measured" and not q.requests[0].crashes_unfixed
    assert q.safe_max_model_len_alone == 4096 * 2 + 129  # chunk 3 (cached 8192) needs 4.00 MB; prompts < 8321 fit
    with pytest.raises(ValueError, match="locked_bytes"):
        predict(cfg, locked_bytes=-1)
    with pytest.raises(ValueError, match="prompt_tokens"):
        predict(cfg, [0])


def test_predict_notes_for_reservation_gaps():
    # chunked prefill off needs prefix caching off on a hybrid model in vLLM 0.33 (MambaModelConfig asserts);
    # these are the report's attention shapes as an attention-only deployment with prefix caching on
    p = predict(seed_config(enable_chunked_prefill=False, max_num_batched_tokens=131072, mamba_block_aligned_split=False))
    assert p.locked_fixed == p.locked_unfixed  # decode only: no continuation reservation
    assert any("prefix-cache hit" in n for n in p.notes)
    # a prefix-cache hit (whole 16-token blocks: get_computed_blocks) can still crash the fixed engine:
    # 528 cached + 129 new is the first request whose dequant call exceeds the decode scratch
    assert p.fixed_safe_any_schedule == 528 + 129 - 1
    off = predict(seed_config(enable_chunked_prefill=False, max_num_batched_tokens=131072, mamba_block_aligned_split=False,
                              enable_prefix_caching=False))
    assert off.fixed_safe_any_schedule == 131072  # one step per prompt and no cache hits: no continuation chunk
    assert not any("prefix-cache hit" in n for n in off.notes)
    d = predict(seed_config(enable_dbo=True))
    assert any("DBO" in n for n in d.notes)
    auto = predict(seed_config(kv_cache_dtype="auto"))
    assert [r.verdict for r in auto.requests] == ["ok without the fix, ok with it"] and auto.locked_unfixed == 0


def test_safe_max_model_len_validation():
    cfg = seed_config()
    with pytest.raises(ValueError, match="schedule"):
        safe_max_model_len(cfg, 0, schedule="sometimes")
    # up to 144 tokens no chunk takes the dequant path: cached lengths are whole 16-token blocks on this
    # hybrid preset, so the first dequant call is 16 cached + 129 new = 145 tokens
    assert safe_max_model_len(cfg, 0, schedule="any") == 144
    assert safe_max_model_len(cfg.replace(mamba_block_aligned_split=False), 0, schedule="any") == 129


def test_inspect_vllm_text_json_and_sources(tmp_path):
    buf = io.StringIO()
    rep = inspect_vllm(SEED_CMD + " --max-num-batched-tokens 4096", NEMOTRON_CONFIG, prompt_tokens=[8192],
                       json_path=tmp_path / "r.json", out=buf, demo=False)
    assert "CRASH without the fix, ok with it" in buf.getvalue()
    assert json.loads((tmp_path / "r.json").read_text())["prediction"]["first_failing_prompt"] == 4225
    assert rep["prediction"]["requests"][0]["crashes_unfixed"] is True
    rep2 = inspect_vllm("--max-num-batched-tokens 2048", preset="nemotron-3-super-120b-a12b", quiet=True)
    assert rep2["prediction"]["first_failing_prompt"] == 2048 + 129
    with pytest.raises(ValueError, match="exactly one"):
        inspect_vllm("--max-model-len 10")


README_ARGS = "vllm serve M --tensor-parallel-size 8 --max-model-len 131072 --max-num-seqs 4 --kv-cache-dtype turboquant_3bit_nc"


def test_inspect_vllm_reports_prompts_vllm_rejects_not_as_crashes():
    buf = io.StringIO()
    rep = inspect_vllm("vllm serve M --max-model-len 4096", preset="nemotron-3-super-120b-a12b",
                       prompt_tokens=[100000, 4096, 4095], out=buf)
    text = buf.getvalue()
    assert "request of 100000 prompt tokens: rejected: exceeds max_model_len (4096)" in text
    assert "request of 4096 prompt tokens: rejected: prompt plus one output token exceeds max_model_len (4096)" in text
    assert not [line for line in text.splitlines() if line.startswith("  -> ") and "CRASH" in line]  # per request
    # the deployment's verdict covers a busy server (issue 30): the any-chunking bound 656 < max_model_len 4096
    assert text.startswith("verdict without the fix: CRASH: _continuation_prefill") and "the bound is 656" in text
    long, edge, ok = rep["prediction"]["requests"]
    assert long["verdict"] == "rejected: exceeds max_model_len (4096)" and long["rejected"] == "exceeds max_model_len (4096)"
    assert (long["crashes_unfixed"], long["crashes_fixed"], long["need_bytes"], long["consumers"]) == (False, False, 0, [])
    assert long["first_refused_unfixed"] is None and long["first_refused_fixed"] is None
    assert edge["verdict"].startswith("rejected: ")
    assert ok["rejected"] is None and ok["verdict"] == "ok without the fix, ok with it"  # one 4095-token chunk, then decode
    assert not any("exceed max_model_len" in n for n in rep["prediction"]["notes"])


def test_predict_default_prompt_is_the_longest_vllm_accepts():
    cfg = seed_config(max_model_len=8192)
    (r,) = predict(cfg).requests
    assert r.prompt_tokens == 8191 and r.rejected is None and r.crashes_unfixed


def test_inspect_readme_example_names_the_first_refused_call_and_the_chunk_size_source():
    buf = io.StringIO()
    rep = inspect_vllm(README_ARGS, NEMOTRON_CONFIG, prompt_tokens=[8192], out=buf)
    text, pred = buf.getvalue(), rep["prediction"]
    assert pred["max_num_batched_tokens"] == 2048  # vLLM 0.33's `vllm serve` default, GPU < 70 GiB
    assert pred["max_num_batched_tokens_source"].startswith("vLLM default (`vllm serve` on a GPU under 70 GiB")
    (req,) = pred["requests"]
    largest = {c["consumer"]: c for c in req["consumers"]}[DEQUANT_CHUNK]
    assert (largest["cached_len"], largest["q_len"], largest["nbytes"]) == (6144, 2048, 3 * MiB)  # the last chunk
    first = req["first_refused_unfixed"]
    assert (first["consumer"], first["cached_len"], first["q_len"], first["nbytes"]) == (DEQUANT_CHUNK, 2048, 2048, MiB)
    assert first["shapes"] == [[[1, 1, 2048, 128], "float16"], [[1, 1, 2048, 128], "float16"]]
    assert req["first_refused_fixed"] is None and req["verdict"] == "CRASH without the fix, ok with it"
    assert ("first refused call without the fix (vLLM dies here): continuation prefill (dequant), cached 2048 q 2048: "
            "1.00 MiB > 0.26 MiB at lock") in text
    assert "chunks of 2048 tokens (max_num_batched_tokens 2048: vLLM default (`vllm serve`" in text
    (note,) = [n for n in pred["notes"] if n.startswith("the bug report's '2.00 MB'")]
    assert "first refused call with max_num_batched_tokens 4096: cached 4096" in note
    assert "two fp16 (1, 1, 4096, 128) buffers = 2 x 1 x 4096 x 128 x 2 bytes = 2,097,152 bytes" in note
    assert "The report does not give max_num_batched_tokens; 4096 is inferred" in note
    assert "This prediction assumes 2048" in note and "at cached 2048 with 1.00 MiB" in note
    assert "note: " + note in text

    given = inspect_vllm(README_ARGS + " --max-num-batched-tokens 4096", NEMOTRON_CONFIG, prompt_tokens=[8192], quiet=True)
    g = given["prediction"]
    assert g["max_num_batched_tokens_source"] == "flag --max-num-batched-tokens"
    first = g["requests"][0]["first_refused_unfixed"]
    assert (first["cached_len"], first["q_len"], first["nbytes"]) == (4096, 4096, 2 * MiB)  # the report's 2.00 MB
    assert not any(n.startswith("the bug report's") for n in g["notes"])

    preset = inspect_vllm(preset="nemotron-3-super-120b-a12b", prompt_tokens=[8192], quiet=True)["prediction"]
    assert preset["max_num_batched_tokens_source"] == (
        "preset nemotron-3-super-120b-a12b: inferred from the bug report's 2.00 MB; the report does not give max_num_batched_tokens"
    )
    gpu = inspect_vllm(README_ARGS, NEMOTRON_CONFIG, prompt_tokens=[8192], gpu_memory_gib=141, quiet=True)["prediction"]
    assert gpu["max_num_batched_tokens"] == 8192 and "GPU of >= 70 GiB" in gpu["max_num_batched_tokens_source"]
    assert gpu["requests"][0]["first_refused_unfixed"] is None  # 8192 tokens are one chunk: no continuation
    assert gpu["requests"][0]["verdict"] == "ok without the fix, ok with it"


def test_first_refused_call_is_in_serving_order_and_decode_counts():
    cfg = seed_config(max_num_batched_tokens=2048)
    r = predict(cfg, [8192]).requests[0]
    assert (r.first_refused_unfixed.cached_len, r.first_refused_unfixed.nbytes) == (2048, MiB)
    assert r.need_bytes == 3 * MiB and r.crashes_unfixed
    # a measured lock smaller than one decode row: the first refused call is decode, after the one prefill chunk
    tiny = predict(cfg, [100], locked_bytes=1024).requests[0]
    assert tiny.first_refused_unfixed.consumer == DECODE and tiny.first_refused_unfixed.cached_len == 100
    assert tiny.first_refused_fixed is None


def test_demo_steps_continuation_cached_len():
    from tqlab.vllm import demo_steps

    cont = [st for st in demo_steps(seed_config()) if st[0] == "get" and st[2][0][1] == torch.float16]
    assert cont[0][2] == continuation_workspace_shapes(4096, 1, 128, 16)  # default: max_num_batched_tokens
    cont = [st for st in demo_steps(seed_config(), 2048) if st[0] == "get" and st[2][0][1] == torch.float16]
    assert cont[0][2] == continuation_workspace_shapes(2048, 1, 128, 16)
    with pytest.raises(ValueError, match="cached_len must be an int >= 1, got 0"):
        demo_steps(seed_config(), 0)


def test_vllm_default_limits():
    from tqlab.vllm import vllm_default_limits

    assert vllm_default_limits()[:2] == (2048, 256)
    assert vllm_default_limits("llm", 80)[:2] == (16384, 1024)
    assert vllm_default_limits("serve", 141)[:2] == (8192, 1024)
    assert vllm_default_limits("serve", 192)[:2] == (16384, 1024)
    with pytest.raises(ValueError, match="usage must be 'serve' or 'llm', got 'batch'"):
        vllm_default_limits("batch")


def test_bug_report_max_num_batched_tokens_is_inferred_from_its_2_mb():
    cfg = seed_config()
    assert bug_report_max_num_batched_tokens(cfg) == 4096
    assert bug_report_max_num_batched_tokens(cfg.replace(max_num_batched_tokens=2048)) == 4096
    # 2 buffers x Hk 1 x 4096 x D 128 x 2 bytes (fp16) == 2 MiB
    assert 2 * cfg.num_kv_heads_per_rank * 4096 * cfg.head_dim * 2 == 2 * MiB
    assert bug_report_max_num_batched_tokens(seed_config(max_num_seqs=16)) is None  # locks at more than 0.26 MB
    assert bug_report_max_num_batched_tokens(seed_config(kv_cache_dtype="auto")) is None
    assert bug_report_max_num_batched_tokens(EngineConfig.from_preset("pr-44053-unit-test")) is None


# --------------------------------------------------------------------------- #
# recorded parity results (data/parity_results.json)                          #
# --------------------------------------------------------------------------- #


def test_recorded_parity_results_load_with_provenance_and_banner(capsys):
    from tqlab.lab.recorded import show_parity_banner
    from tqlab.vllm import format_trace_report, load_parity_results

    prov, rec = load_parity_results()
    for key in ("device", "date", "commit", "command", "torch", "vllm"):
        assert prov[key] and prov[key] != "unknown", key
    assert rec["summary"].get("failed", 0) == 0 and rec["summary"]["passed"] > 0
    text = show_parity_banner(prov)
    assert f"vLLM {prov['vllm']}" in text and "vLLM is not importable here" in text
    assert text.splitlines()[0] in capsys.readouterr().out
    (unfixed, fixed) = rec["test_seed_scenario_table:rows"]
    assert unfixed["vllm"]["error"].endswith(SEED_TAIL)
    assert fixed["vllm"]["error"] is None
    table = format_trace_report(unfixed["vllm"]["trace"])
    assert "VIOLATION slot 0: turboquant_attn.py:" in table and "locked at 0.26 MiB" in table
    assert all(r["same"] for r in rec["test_manager_table:rows"] + rec["test_reservation_table:rows"])
    with pytest.raises(ValueError, match="missing"):
        show_parity_banner({"device": "cpu"})


def test_inspect_vllm_eager_is_never_locked_and_json_has_the_stable_object(tmp_path):
    # vLLM 0.33: an eager start-up never calls lock_workspace() (gpu_worker.py compile_or_warm_up_model
    # skips capture_model); before, this said "workspace at lock: 0.28 MB ... ok" with nothing captured.
    buf = io.StringIO()
    rep = inspect_vllm("vllm serve M --enforce-eager", preset="pr-44053-unit-test", prompt_tokens=[100],
                       json_path=tmp_path / "r.json", out=buf)
    text = buf.getvalue()  # the consumer table still lists the 0.28 MiB decode request; no line calls it a lock
    assert "workspace never locked" in text and "workspace at lock" not in text and "lock: never" in text
    assert "verdict without the fix: never locked" in text
    obj = json.loads((tmp_path / "r.json").read_text())
    assert {k: obj[k] for k in ("capture_sizes", "decode_rows_at_lock", "locked_bytes", "verdict",
                                "first_failing_prompt_tokens", "first_refused_call", "locked_bytes_with_fix")} == {
        "capture_sizes": [], "decode_rows_at_lock": 0, "locked_bytes": None, "verdict": "never_locked",
        "first_failing_prompt_tokens": None, "first_refused_call": None, "locked_bytes_with_fix": None}
    assert rep["prediction"]["requests"][0]["crashes_unfixed"] is False
    graphs = inspect_vllm(None, preset="nemotron-3-super-120b-a12b", quiet=True)
    assert (graphs["capture_sizes"], graphs["locked_bytes"], graphs["verdict"],
            graphs["first_failing_prompt_tokens"]) == ([1, 2, 4, 8], 268_544, "crash", 4225)


def test_inspect_vllm_json_dash_prints_only_json_and_a_missing_dir_is_a_value_error(tmp_path):
    buf = io.StringIO()
    inspect_vllm(None, preset="nemotron-3-super-120b-a12b", prompt_tokens=[8192], json_path="-", out=buf)
    obj = json.loads(buf.getvalue())
    assert obj["verdict"] == "crash" and obj["locked_bytes"] == 268_544
    with pytest.raises(ValueError, match="cannot write the JSON report to .*missing"):
        inspect_vllm(None, preset="nemotron-3-super-120b-a12b", json_path=tmp_path / "missing" / "x.json", quiet=True)
