"""Requests, KV-cache blocks and a chunked-prefill scheduler (vLLM V1 style, one rank).

Each step has a token budget of ``max_num_batched_tokens`` (or a smaller
``max_num_scheduled_tokens``: ``EngineConfig.chunk_budget``). Running decodes are
scheduled first (one token each), then the unfinished prefill of running
requests, then waiting requests are admitted while fewer than ``max_num_seqs``
run. With chunked prefill a prompt is split into chunks of at most the
remaining budget; a chunk after the first has cached tokens — a *continuation
prefill*. For a hybrid model with prefix caching on, each chunk but a prompt's last
then ends on a block boundary (:func:`tqlab.core.vllm_rules.mamba_block_aligned_split`,
vLLM's ``Scheduler._mamba_block_aligned_split``).
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field

from tqlab.core.workspace_layout import cdiv
from tqlab.core.vllm_rules import mamba_block_aligned_split
from tqlab.core.config import EngineConfig

__all__ = ["BlockPool", "BlockRuns", "Request", "RequestStatus", "Scheduler", "SchedulerOutput"]


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class BlockRuns:
    """A request's KV-cache block ids, in order, as ``[start, stop)`` runs (adjacent runs merged).

    A 10**9-token prompt holds 62,500,000 blocks of 16 tokens: as a Python list that
    was up to 6.7 GB and minutes of copying per step on ``meta`` (issue 22); from a
    fresh pool it is one run. Iterating yields the ids; ``len()`` is the block count
    (O(1)); ``runs`` the ``(start, stop)`` pairs. Compares equal to a list of the same ids.
    """

    __slots__ = ("_runs", "_len")

    def __init__(self, runs: list[tuple[int, int]] | None = None):
        self._runs: list[list[int]] = []
        self._len = 0
        self.extend(runs or [])

    def extend(self, runs: list[tuple[int, int]]) -> None:
        """Append ``(start, stop)`` runs after the blocks already held."""
        for start, stop in runs:
            if stop <= start:
                continue
            if self._runs and self._runs[-1][1] == start:
                self._runs[-1][1] = stop
            else:
                self._runs.append([start, stop])
            self._len += stop - start

    @property
    def runs(self) -> list[tuple[int, int]]:
        return [(a, b) for a, b in self._runs]

    def __len__(self) -> int:
        return self._len

    def __iter__(self):
        for a, b in self._runs:
            yield from range(a, b)

    def __eq__(self, other) -> bool:
        if isinstance(other, BlockRuns):
            return self._runs == other._runs
        if isinstance(other, (list, tuple)):
            return len(other) == self._len and list(self) == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"BlockRuns({self.runs})"


@dataclass
class Request:
    """One request. ``prompt_token_ids`` may be None on the meta device (length only)."""

    request_id: int
    prompt_len: int
    max_tokens: int
    prompt_token_ids: list[int] | None = None
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_ids: BlockRuns = field(default_factory=BlockRuns)
    status: RequestStatus = RequestStatus.WAITING

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + len(self.output_token_ids)

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed_tokens < self.prompt_len

    def token_at(self, pos: int) -> int:
        if pos < self.prompt_len:
            return 0 if self.prompt_token_ids is None else self.prompt_token_ids[pos]
        return self.output_token_ids[pos - self.prompt_len]


class BlockPool:
    """Free KV-cache blocks as a stack of ranges. Block 0 is the null block (padding rows point at it).

    Allocation order is a LIFO stack of block ids: a fresh pool hands out
    ``1, 2, 3, ...``; ``free(ids)`` pushes ``ids`` so the next allocations return
    them again in the same order. The stack is kept as ``[start, stop)`` runs
    (adjacent runs merged) plus a counter, never one Python object per block:
    a fresh pool of 10**9 blocks is one run, O(1) memory; memory grows only
    with the number of non-contiguous runs freed (vLLM's ``BlockPool`` in
    ``vllm/v1/core/block_pool.py`` keeps one ``KVCacheBlock`` per block, which a
    simulator on ``meta`` cannot afford at ``max_model_len`` 10**9).

    Raises ``ValueError`` for ``num_blocks`` < 2 or not an int.
    """

    def __init__(self, num_blocks: int):
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int):
            raise ValueError(f"num_blocks must be an int, got {num_blocks!r}")
        if num_blocks < 2:
            raise ValueError(f"need at least 2 KV-cache blocks (one is the null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self._runs: list[list[int]] = [[1, num_blocks]]  # [start, stop); the last run is the top of the stack
        self._num_free = num_blocks - 1

    @property
    def num_free(self) -> int:
        return self._num_free

    @property
    def num_runs(self) -> int:
        """How many ``[start, stop)`` runs hold the free blocks (the pool's memory, in Python objects)."""
        return len(self._runs)

    def allocate(self, n: int) -> list[int]:
        """Pop ``n`` block ids as a list (O(n); the scheduler uses :meth:`allocate_runs`).

        Raises ``ValueError`` for a negative or non-int ``n``; ``RuntimeError``
        when fewer than ``n`` blocks are free (nothing is taken then).
        """
        return [i for a, b in self.allocate_runs(n) for i in range(a, b)]

    def allocate_runs(self, n: int) -> list[tuple[int, int]]:
        """Pop ``n`` block ids as ``(start, stop)`` runs, in the order :meth:`allocate` gives them (O(runs)).

        Raises like :meth:`allocate`.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"number of blocks to allocate must be an int >= 0, got {n!r}")
        if n > self._num_free:
            raise RuntimeError(f"out of KV-cache blocks: need {n}, {self._num_free} free")
        out: list[tuple[int, int]] = []
        left = n
        while left:
            run = self._runs[-1]
            k = min(left, run[1] - run[0])
            out.append((run[0], run[0] + k))
            run[0] += k
            left -= k
            if run[0] == run[1]:
                self._runs.pop()
        self._num_free -= n
        return out

    def free(self, ids) -> None:
        """Return ``ids`` (a list of ids or a :class:`BlockRuns`) to the pool; the next allocations hand
        them out in this order.

        Raises ``ValueError`` (pool unchanged) for an id outside ``1..num_blocks - 1``
        (block 0, the null block, is never allocated, so never freed).
        """
        if isinstance(ids, BlockRuns):
            runs = [list(r) for r in ids.runs]
            bad = next((b if a > 0 else a for a, b in runs if a < 1 or b > self.num_blocks), None)
            count = len(ids)
        else:
            ids = list(ids)
            bad = next((i for i in ids if isinstance(i, bool) or not isinstance(i, int) or not 0 < i < self.num_blocks),
                       None)
            runs = []  # ids as ascending runs, in pop order
            for i in ids:
                if runs and runs[-1][1] == i:
                    runs[-1][1] += 1
                else:
                    runs.append([i, i + 1])
            count = len(ids)
        if bad is not None:
            raise ValueError(f"cannot free block {bad!r}: block ids run from 1 to {self.num_blocks - 1} (0 is the null block)")
        for run in reversed(runs):  # push so the first id ends on top
            top = self._runs[-1] if self._runs else None
            if top is not None and run[1] == top[0]:
                top[0] = run[0]
            else:
                self._runs.append(run)
        self._num_free += count


@dataclass
class SchedulerOutput:
    """``decodes``: requests decoding one token; ``prefills``: ``(request, cached_len, q_len)`` chunks."""

    decodes: list[Request]
    prefills: list[tuple[Request, int, int]]

    @property
    def num_tokens(self) -> int:
        return len(self.decodes) + sum(q for _, _, q in self.prefills)

    @property
    def is_empty(self) -> bool:
        return not self.decodes and not self.prefills


class Scheduler:
    def __init__(self, config: EngineConfig, num_blocks: int):
        self.config = config
        self.pool = BlockPool(num_blocks)
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self._ids = itertools.count()

    def new_request_id(self) -> int:
        return next(self._ids)

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _blocks_for(self, req: Request, upto_tokens: int) -> int:
        need = cdiv(upto_tokens, self.config.block_size)
        return max(0, need - len(req.block_ids))

    def _grow(self, req: Request, upto_tokens: int) -> None:
        req.block_ids.extend(self.pool.allocate_runs(self._blocks_for(req, upto_tokens)))

    def schedule(self) -> SchedulerOutput:
        budget = self.config.chunk_budget  # vLLM: max_num_scheduled_tokens, within max_num_batched_tokens
        chunked = self.config.enable_chunked_prefill
        out = SchedulerOutput([], [])
        for req in self.running:
            if not req.is_prefilling and budget > 0:
                self._grow(req, req.num_tokens)
                out.decodes.append(req)
                budget -= 1

        def take(req: Request) -> bool:
            nonlocal budget
            remaining = req.prompt_len - req.num_computed_tokens
            q = min(remaining, budget) if chunked else (remaining if remaining <= budget else 0)
            if q > 0:
                q = mamba_block_aligned_split(self.config, req.num_computed_tokens, q, req.prompt_len)
            if q <= 0:
                return False
            self._grow(req, req.num_computed_tokens + q)
            out.prefills.append((req, req.num_computed_tokens, q))
            budget -= q
            return True

        for req in self.running:
            if req.is_prefilling:
                take(req)
        while self.waiting and len(self.running) < self.config.max_num_seqs and budget > 0:
            req = self.waiting[0]
            if not take(req):
                break
            self.waiting.pop(0)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
        return out

    def finish(self, req: Request) -> None:
        req.status = RequestStatus.FINISHED
        self.pool.free(req.block_ids)
        req.block_ids = BlockRuns()
        if req in self.running:
            self.running.remove(req)
