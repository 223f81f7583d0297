"""The CUDA-graph hazards of notebook 05, each as one function that returns its numbers.

Warm-up before capture, pointer stability (replay == eager), the stale-pointer
replay (without guard, with the lock, with the guard), and three cases: capture
order (vLLM issue #45670, PR #46067), a consumer whose need is not monotonic in
the batch (a constructed example), a warm-up after capture (vLLM issue #55336,
PR #55341). Every demonstration stays in memory the process
owns (the runner keeps the captured buffers), so a stale replay cannot crash.
Also :class:`LiveCells`, the notebook's log of which GPU cells ran live. The building blocks
(buckets, the non-monotonic backend, the demo engine, decode batches) live in
:mod:`tqlab.lab.graph_setup` and are re-exported here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

import torch

from tqlab.predict.analysis import decode_rows_at_lock
from tqlab.core.config import EngineConfig
from tqlab.engine.cuda_graph import (
    CUDAGraphDecodeRunner,
    DecodeBatch,
    no_gc_during_capture,
    select_bucket,
)
from tqlab.engine.replay_guard import StalePointerError
from tqlab.strategies.fixes import sync_device
from tqlab.lab.graph_setup import (
    BatchDependentSplitsBackend,
    bucket_workspace_bytes,
    capture_buckets,
    compare_logits,
    decode_shapes_for,
    make_demo_config,
    make_engine_and_runner,
    prepare_decode_batch,
    reserve_for_buckets,
)
from tqlab.core.workspace import WorkspaceLockedError

__all__ = [
    "BatchDependentSplitsBackend",
    "LiveCells",
    "bucket_workspace_bytes",
    "capture_buckets",
    "capture_order_demo",
    "compare_logits",
    "decode_shapes_for",
    "late_warmup_demo",
    "make_demo_config",
    "make_engine_and_runner",
    "nonmonotonic_demo",
    "pointer_stability_demo",
    "prepare_decode_batch",
    "reserve_for_buckets",
    "stale_replay_demo",
    "warmup_demo",
]


# --------------------------------------------------------------------------- #
# Demonstration: warm-up before capture                                       #
# --------------------------------------------------------------------------- #


def warmup_demo(config: EngineConfig, device: str | torch.device = "cpu") -> dict:
    """Capture the largest bucket on an empty workspace, with and without eager warm-up.

    Without reservation (``fix=False``) the workspace is empty at capture time.
    With warm-up the eager run grows it and the capture allocates nothing; without
    warm-up the growth happens *inside* the capture (on CUDA: from the graph's
    private pool). Returns, per variant, resize events during warm-up and during
    capture, the workspace size and whether the capture raised (and what).
    """
    out = {}
    b = decode_rows_at_lock(config)
    for name, nw in (("with_warmup", 2), ("without_warmup", 0)):
        eng, dr = make_engine_and_runner(config, device, fix=False, capture=False, lock=False)
        row = {"bucket": b, "num_warmups": nw, "workspace_bytes_before": eng.workspace.size_bytes(0)}
        try:
            dr.capture(b, num_warmups=nw)
            cap = dr.graphs[b]
            row.update(ok=True, resizes_in_warmup=cap.resizes_in_warmup, resizes_in_capture=cap.resizes_in_capture,
                       error=None)
        except Exception as e:  # a failed capture is a result here, not a crash
            row.update(ok=False, resizes_in_warmup=None, resizes_in_capture=None, error=f"{type(e).__name__}: {e}"[:400])
        row["workspace_bytes_after"] = eng.workspace.size_bytes(0)
        out[name] = row
        del eng, dr
    return out


# --------------------------------------------------------------------------- #
# Demonstration: pointer stability and replay == eager                        #
# --------------------------------------------------------------------------- #


def pointer_stability_demo(config: EngineConfig, device: str | torch.device = "cpu", *, batch: int | None = None,
                           steps: int = 3, context_len: int = 64) -> dict:
    """Capture every bucket (reserved, warmed up, largest first, locked), then replay and compare.

    Each step replays the decode of ``batch`` rows (default ``max_num_seqs - 1``,
    so one lane is padding), compares the logits with the eager step on the same
    inputs, and reads the workspace views' ``data_ptr()`` again; between steps an
    eager continuation-prefill request uses the same workspace bytes. Returns the
    pointers at capture and at each step, and the comparison.
    """
    eng, dr = make_engine_and_runner(config, device, fix=True, kv_cache_tokens=config.max_num_seqs * context_len + 4 * config.block_size)
    n = batch if batch is not None else max(1, config.max_num_seqs - 1)
    bucket = select_bucket(n, dr.captured_sizes)
    db = prepare_decode_batch(eng.runner, n, context_len)
    ws = eng.workspace
    cap = dr.graphs[bucket]
    shapes = decode_shapes_for(eng.runner.backend)(bucket)
    rows = []
    for step in range(steps):
        dr.static.fill(db, bucket)
        ref = dr.eager(bucket)[:n].clone()
        got = dr.run(*db.astuple()).clone()
        sync_device(eng.device)
        views_now = ws.get_simultaneous(*shapes)
        rows.append({
            "step": step,
            "buffer_ptr": ws.data_ptrs()[0],
            "view_ptrs": [v.data_ptr() for v in views_now],
            "same_as_capture": [v.data_ptr() for v in views_now] == list(cap.view_ptrs[0]),
            **compare_logits(got, ref),
        })
        # An eager continuation prefill in between uses the same buffer (offset 0 again).
        cont = eng.backend.forward_prefill
        c = eng.config
        cached = min(c.max_model_len // 2, 200)
        q = torch.zeros((c.max_num_batched_tokens, c.num_heads_per_rank, c.head_dim),
                        dtype=eng.runner.model.compute_dtype, device=eng.device)
        kv = torch.zeros((q.shape[0], c.num_kv_heads_per_rank, c.head_dim), dtype=q.dtype, device=eng.device)
        cont(q, kv, kv, eng.runner.kv_caches[0], db.block_tables[0], cached_len=cached)
    return {
        "device": str(eng.device),
        "mode": dr.mode,
        "batch": n,
        "bucket": bucket,
        "buckets": dr.captured_sizes,
        "workspace_bytes": ws.size_bytes(0),
        "capture_buffer_ptr": cap.snapshot.ptrs[0],
        "capture_view_ptrs": list(cap.view_ptrs[0]),
        "num_workspace_requests_in_graph": len(cap.view_ptrs),
        "distinct_view_ptr_sets_in_graph": len(set(cap.view_ptrs)),
        "resizes_in_capture": {b: dr.graphs[b].resizes_in_capture for b in dr.captured_sizes},
        "steps": rows,
        "stats": dict(dr.stats),
    }


# --------------------------------------------------------------------------- #
# Demonstration: the stale-pointer hazard                                     #
# --------------------------------------------------------------------------- #


def _owner_divergence(dr: CUDAGraphDecodeRunner, bucket: int, old_buf: torch.Tensor, ref: torch.Tensor, n: int,
                      trials: int = 5, fills: int = 2000) -> list[dict]:
    """CUDA only: while the stale graph replays, a second stream (the freed block's "new owner") keeps writing NaN
    into the old buffer. Returns the logits comparison of each trial."""
    dev = old_buf.device
    victim = old_buf.view(torch.float32)
    owner = torch.cuda.Stream(device=dev)
    # The owner's work as one graph of many fills, so it runs for milliseconds from one launch.
    og = torch.cuda.CUDAGraph()
    torch.cuda.synchronize(dev)
    with no_gc_during_capture(), torch.cuda.graph(og, stream=owner):
        for _ in range(fills):
            victim.fill_(float("nan"))
    torch.cuda.synchronize(dev)
    res = []
    cap = dr.graphs[bucket]
    main = torch.cuda.current_stream(dev)
    for _ in range(trials):
        torch.cuda.synchronize(dev)
        owner.wait_stream(main)
        with torch.cuda.stream(owner):
            og.replay()
        cap.graph.replay()  # no guard: this is the hazard
        torch.cuda.synchronize(dev)
        res.append(compare_logits(cap.output[:n], ref))
    del og
    return res


def _stale_with_lock(dr: CUDAGraphDecodeRunner, db: DecodeBatch, ref: torch.Tensor, grow: int) -> dict:
    """Phase 1: a growth request after the lock is refused; the pointers stay, replay still equals eager."""
    ws, cap = dr.workspace, dr.graphs[select_bucket(len(db), dr.captured_sizes)]
    try:
        ws.get_simultaneous(((grow,), torch.uint8))
        return {"refused": False}
    except WorkspaceLockedError as e:
        got = dr.run(*db.astuple()).clone()
        return {"refused": True, "error": str(e), "buffer_ptr_after": ws.data_ptrs()[0],
                "pointer_unchanged": ws.data_ptrs()[0] == cap.snapshot.ptrs[0], **compare_logits(got, ref)}


def _stale_without_guard(dr: CUDAGraphDecodeRunner, db: DecodeBatch, ref: torch.Tensor, grow: int,
                         concurrent_owner: bool) -> dict:
    """Phase 2: unlock, grow, lock, then replay with the guard off: the graph writes into the old buffer."""
    ws, n = dr.workspace, len(db)
    bucket = select_bucket(n, dr.captured_sizes)
    cap, dev = dr.graphs[bucket], ws.device
    ws.unlock()
    ws.get_simultaneous(((grow,), torch.uint8))
    ws.lock()
    old, new = cap.kept_buffers[0], ws.buffer(0)
    inside = lambda buf: all(buf.data_ptr() <= p < buf.data_ptr() + buf.numel() for p in cap.view_ptrs[0])  # noqa: E731
    nd: dict[str, Any] = {
        "old_buffer_ptr": old.data_ptr(), "new_buffer_ptr": new.data_ptr(), "new_bytes": new.numel(),
        "graph_view_ptrs": list(cap.view_ptrs[0]), "graph_views_inside_old_buffer": inside(old),
        "graph_views_inside_new_buffer": inside(new), "stale_buckets": dr.stale_buckets(),
    }
    old.fill_(0xAB)
    new.fill_(0xCD)
    sync_device(dev)
    got = dr.run(*db.astuple()).clone()
    sync_device(dev)
    nd["old_buffer_bytes_overwritten"] = int((old != 0xAB).sum())
    nd["new_buffer_bytes_touched"] = int((new != 0xCD).sum())
    nd["exclusive_old_buffer"] = compare_logits(got, ref)
    # The old block handed to a new owner, who stored its data there before the replay.
    pattern = torch.arange(old.numel(), device=dev, dtype=torch.int64).remainder(251).to(torch.uint8)
    old.copy_(pattern)
    dr.run(*db.astuple())
    sync_device(dev)
    nd["new_owner_bytes_corrupted"] = int((old != pattern).sum())
    nd["new_owner_bytes"] = old.numel()
    if concurrent_owner and dev.type == "cuda":
        t = nd["concurrent_owner_trials"] = _owner_divergence(dr, bucket, old, ref, n)
        nd["concurrent_owner_diverged"] = sum(1 for r in t if not r["bitwise_equal"])
    return nd


def stale_replay_demo(config: EngineConfig, device: str | torch.device = "cpu", *, context_len: int = 64,
                      concurrent_owner: bool | None = None) -> dict:
    """Unlock, grow the workspace, and replay a captured graph: with the lock, without guard, with the guard.

    1. ``lock``: the growth request after the lock is refused
       (:class:`~tqlab.core.workspace.WorkspaceLockedError`); pointers unchanged;
       replay still equals eager.
    2. ``no_guard``: unlock, grow (the manager frees the captured buffer; the
       runner keeps a reference, so the memory stays ours), replay without the
       guard. Shown: the graph's views still point into the old buffer; a
       sentinel written into the old buffer is overwritten by the replay while
       the new buffer is untouched; a "new owner" pattern in the old buffer is
       destroyed; and (CUDA, ``concurrent_owner``) with the new owner writing
       on another stream during the replay, the logits diverge from eager.
    3. ``guard``: the same replay with the guard on raises
       :class:`~tqlab.engine.replay_guard.StalePointerError`, naming the moved
       slot, before anything runs.
    """
    dev = torch.device(device)
    if concurrent_owner is None:
        concurrent_owner = dev.type == "cuda"
    eng, dr = make_engine_and_runner(config, dev, fix=True, guard=False, keep_captured_buffers=True,
                                     kv_cache_tokens=config.max_num_seqs * context_len + 4 * config.block_size)
    n = config.max_num_seqs
    bucket = select_bucket(n, dr.captured_sizes)
    db = prepare_decode_batch(eng.runner, n, context_len)
    dr.static.fill(db, bucket)
    ref = dr.eager(bucket)[:n].clone()
    cap = dr.graphs[bucket]
    grow = eng.workspace.size_bytes(0) * 2 + (1 << 20)
    result: dict[str, Any] = {"device": str(dev), "mode": dr.mode, "bucket": bucket, "batch": n,
                              "captured_buffer_ptr": cap.snapshot.ptrs[0], "captured_bytes": cap.snapshot.sizes[0],
                              "grow_request_bytes": grow}
    result["lock"] = _stale_with_lock(dr, db, ref, grow)
    result["no_guard"] = _stale_without_guard(dr, db, ref, grow, concurrent_owner)
    dr.guard = True
    try:
        dr.run(*db.astuple())
        result["guard"] = {"raised": False}
    except StalePointerError as e:
        result["guard"] = {"raised": True, "error": str(e), "slot": e.slot, "bucket": e.bucket}
    result["stats"] = dict(dr.stats)
    return result


# --------------------------------------------------------------------------- #
# Cases: capture order, a non-monotonic need (constructed), a late warm-up    #
# --------------------------------------------------------------------------- #


def _replay_all(eng, dr: CUDAGraphDecodeRunner, context_len: int) -> dict[int, dict]:
    """Run a full batch through every bucket with the guard on; per bucket: ok, or the guard's error."""
    n = max(dr.captured_sizes)
    db = prepare_decode_batch(eng.runner, n, context_len)
    out = {}
    for b in dr.captured_sizes:
        try:
            dr.run(*db.rows(b).astuple())
            out[b] = {"ok": True}
        except StalePointerError as e:
            out[b] = {"ok": False, "slot": e.slot, "error": str(e)}
    return out


def _capture_table(dr: CUDAGraphDecodeRunner) -> list[dict]:
    return [{"bucket": b, "buffer_ptr": dr.graphs[b].snapshot.ptrs[0], "bytes": dr.graphs[b].snapshot.sizes[0],
             "resizes_in_warmup": dr.graphs[b].resizes_in_warmup, "resizes_in_capture": dr.graphs[b].resizes_in_capture}
            for b in dr.captured_sizes]


def capture_order_demo(config: EngineConfig, device: str | torch.device = "cpu", *, order: str = "smallest_first",
                       reserve: str | None = None, context_len: int = 32) -> dict:
    """Case (a): capture buckets in ``order`` with or without a reservation, then replay every bucket guarded.

    Without reservation (``fix=False``) and small-to-large, each warm-up grows
    the workspace and frees the buffer the previous graphs baked in: those
    graphs are stale (vLLM: an illegal memory access on the first decode). The
    guard refuses them; reserve-then-capture (``reserve="max_num_seqs"``) or
    largest first avoids the growth.
    """
    eng, dr = make_engine_and_runner(config, device, fix=False, order=order, reserve=reserve, guard=True,
                          keep_captured_buffers=True,
                          kv_cache_tokens=config.max_num_seqs * context_len + 4 * config.block_size)
    return {"order": order, "reserve": reserve, "captures": _capture_table(dr), "final_ptr": eng.workspace.data_ptrs()[0],
            "final_bytes": eng.workspace.size_bytes(0), "stale_buckets": dr.stale_buckets(),
            "replay": _replay_all(eng, dr, context_len)}


def nonmonotonic_demo(config: EngineConfig, device: str | torch.device = "cpu", *, reserve: str = "max_num_seqs",
                      small_batch_max: int = 2, context_len: int = 32) -> dict:
    """Case (b): a consumer that needs more workspace at a smaller batch; capture largest first.

    With PR #44053's reservation (decode at ``max_num_seqs``) the capture of the
    small bucket still grows the workspace, after the larger buckets were
    captured: they are stale, and the lock (taken later) cannot notice. Only
    ``reserve="all_buckets"`` (the maximum over every bucket) is safe.
    """
    factory = lambda c, w, f: BatchDependentSplitsBackend(c, w, f, small_batch_max=small_batch_max)  # noqa: E731
    eng, dr = make_engine_and_runner(config, device, fix=True, reserve=reserve, backend_factory=factory, guard=True,
                          keep_captured_buffers=True,
                          kv_cache_tokens=config.max_num_seqs * context_len + 4 * config.block_size)
    need = bucket_workspace_bytes(decode_shapes_for(eng.runner.backend), dr.captured_sizes)
    return {"reserve": reserve, "need_bytes": need, "argmax_need": max(need, key=lambda b: (need[b], b)),
            "captures": _capture_table(dr), "final_bytes": eng.workspace.size_bytes(0),
            "stale_buckets": dr.stale_buckets(), "replay": _replay_all(eng, dr, context_len)}


def late_warmup_demo(config: EngineConfig, device: str | torch.device = "cpu", *, context_len: int = 32) -> dict:
    """Case (c): a warm-up that runs *after* capture and grows the workspace.

    ``before_lock``: it runs between capture and lock (e.g. an extra dummy run
    added to start-up), so the lock cannot catch it: the guard must, at the
    first replay. ``after_lock``: the lock refuses the growth. The warm-up is a
    decode dummy run of ``2 * max_num_seqs`` rows (more than was reserved).
    """
    res = {}
    rows = 2 * config.max_num_seqs
    for when in ("before_lock", "after_lock"):
        eng, dr = make_engine_and_runner(config, device, fix=True, guard=True, keep_captured_buffers=True, lock=(when == "after_lock"),
                              kv_cache_tokens=config.max_num_seqs * context_len + 4 * config.block_size)
        before = eng.workspace.data_ptrs()[0]
        row: dict[str, Any] = {"warmup_rows": rows, "bytes_before": eng.workspace.size_bytes(0)}
        try:
            eng.runner.dummy_decode(rows)
            row["warmup_refused"] = None
        except WorkspaceLockedError as e:
            row["warmup_refused"] = str(e)
        if not eng.workspace.is_locked():
            eng.workspace.lock()
        row.update(bytes_after=eng.workspace.size_bytes(0), moved=eng.workspace.data_ptrs()[0] != before,
                   stale_buckets=dr.stale_buckets(), replay=_replay_all(eng, dr, context_len))
        res[when] = row
    return res


class LiveCells:
    """Which GPU-live cells of a notebook ran, so that a GPU run cannot "pass" while skipping one.

    ``expected``: names of the cells that must run live on CUDA. Each such
    cell calls :meth:`ran` when it computed live, or :meth:`recorded` when it
    showed recorded data instead. :meth:`finish` raises ``AssertionError`` on
    CUDA if any expected cell did not run live, and writes the log as JSON if
    given a path.
    """

    def __init__(self, device: str | torch.device, expected: Sequence[str]):
        self.device = str(device)
        self.expected = list(expected)
        if len(set(self.expected)) != len(self.expected):
            raise ValueError(f"duplicate live-cell names in {self.expected}")
        self.live: list[str] = []
        self.from_recorded: list[str] = []

    def _check(self, name: str) -> None:
        if name not in self.expected:
            raise ValueError(f"unknown live cell {name!r}; expected one of {self.expected}")

    def ran(self, name: str) -> None:
        self._check(name)
        if name not in self.live:
            self.live.append(name)

    def recorded(self, name: str) -> None:
        self._check(name)
        if name not in self.from_recorded:
            self.from_recorded.append(name)

    @property
    def on_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def missing(self) -> list[str]:
        return [n for n in self.expected if n not in self.live]

    def summary(self) -> dict:
        return {"device": self.device, "expected": self.expected, "ran": self.live, "recorded": self.from_recorded,
                "missing": self.missing()}

    def finish(self, path: str | os.PathLike | None = None) -> dict:
        s = self.summary()
        if path:
            Path(path).write_text(json.dumps(s, indent=2))
        if self.on_cuda and s["missing"]:
            raise AssertionError(f"DEVICE={self.device} but these GPU-live cells did not run live: {s['missing']}")
        return s

