"""The safe-length bounds count the decode steps a request makes (issue 30: "the first decode step is always asked").

A TurboQuant deployment with ``k = 2`` speculative tokens locks its workspace at 0 bytes without PR #44053 (no
decode capture asks the workspace), and the drafter's second pass is a one-token decode through
``turboquant_attn.py`` ``_decode_attention`` (``SpecDecodeBaseProposer.propose``): one row of split-KV scratch,
``(1, 24, 32, 257) f32 + (1, 24, 256) bf16 + (1, 24) f32`` = 789,504 + 12,288 + 256 = 802,048 bytes, whatever the
prompt's length. So every request crashes at its first decode step: no prompt is short enough and no
``max_model_len`` is safe. ``--max-tokens 1`` (no decode step) keeps asking the prefill alone.
"""

from __future__ import annotations

from click.testing import CliRunner

from tqlab.cli import app
from tqlab.core.config import EngineConfig
from tqlab.predict import analysis

FLAGS = ["--num-attention-heads", "24", "--num-key-value-heads", "8", "--head-dim", "256", "--max-num-seqs", "1",
         "--max-model-len", "1024", "--max-num-batched-tokens", "1024", "--kv-cache-dtype", "turboquant_4bit_nc",
         "--num-speculative-tokens", "2"]
CFG = EngineConfig(num_attention_heads=24, num_key_value_heads=8, head_dim=256, max_num_seqs=1, max_model_len=1024,
                   max_num_batched_tokens=1024, kv_cache_dtype="turboquant_4bit_nc", num_speculative_tokens=2)


def _bounds(p: analysis.Prediction) -> tuple:
    return (p.verdict, p.locked_bytes, p.first_failing_prompt_tokens, p.safe_max_model_len_alone,
            p.safe_max_model_len_any_schedule, p.fixed_safe_any_schedule)


def test_a_first_decode_step_that_overflows_leaves_no_safe_length():
    assert analysis.decode_bytes(CFG, 1) == 802_048 and analysis.decode_step_refused(CFG, 0, 2)
    for max_tokens in (2, 16):
        p = analysis.predict(CFG, max_tokens=max_tokens)
        assert _bounds(p) == ("crash", 0, 1, None, None, 1024)
        assert p.first_refused_call == {"caller": "_decode_attention (drafter)", "required_bytes": 802_048,
                                        "current_bytes": 0, "cached_len": 1, "q_len": 1}
        (note,) = [n for n in p.notes if "first decode step" in n]
        assert note.kind.value == "reservation_gap"
        assert note.startswith("every request's first decode step asks turboquant_attn.py:_decode_attention "
                               "(drafter) for 802,048 bytes (one row) > 0 locked")


def test_max_tokens_1_is_the_prefill_only_question():
    """Before this change every max_tokens gave these bounds: prompts up to 1,023 tokens prefill alone in one chunk
    (no continuation call), and under any chunking a request longer than 129 tokens can have a continuation chunk
    of 129 new tokens after 1 or more cached ones, which asks more than 0 bytes."""
    p = analysis.predict(CFG, max_tokens=1)
    assert _bounds(p) == ("crash", 0, None, 1024, 129, 1024)
    assert not analysis.decode_step_refused(CFG, 0, 1)
    assert not [n for n in p.notes if "first decode step" in n]


def test_a_decode_step_that_fits_changes_nothing():
    """k = 1: the drafter's only pass has 1 + k token rows, no workspace call (decode_uses_workspace False); and
    with PR #44053 the lock (8,388,608 bytes) holds the one-row decode."""
    k1 = CFG.replace(num_speculative_tokens=1)
    assert not analysis.decode_step_refused(k1, 0, 2)
    assert _bounds(analysis.predict(k1)) == _bounds(analysis.predict(k1, max_tokens=1)) == ("crash", 0, None, 1024, 129, 1024)
    fixed = analysis.predict(CFG, fix=True)
    assert (fixed.verdict, fixed.locked_bytes, fixed.first_failing_prompt_tokens, fixed.safe_max_model_len_alone,
            fixed.safe_max_model_len_any_schedule) == ("ok", 8_388_608, None, 1024, 1024)


def test_plan_says_every_prompt_crashes_at_its_first_decode_step():
    r = CliRunner().invoke(app, ["plan", *FLAGS])
    text = " ".join(r.output.split())
    assert r.exit_code == 3, r.output
    assert ("every prompt crashes at its first decode step (_decode_attention (drafter) asks 802,048 bytes); without "
            "decode steps (--max-tokens 1) the longest prompt that survives is 1023 tokens; verdict: crash") in text
    assert "safe max_model_len without the fix: None (requests alone), None (any chunking); with the fix: 1024" in text
    assert "for the deployment: the decode step every prompt makes (shown for a 1-token prompt)" in text
    assert "another consumer" not in text
    one = " ".join(CliRunner().invoke(app, ["plan", *FLAGS, "--max-tokens", "1"]).output.split())
    assert "safe max_model_len without the fix: 1024 (requests alone), 129 (any chunking)" in one
