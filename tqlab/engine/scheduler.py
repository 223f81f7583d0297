"""Requests, KV-cache blocks and a chunked-prefill scheduler (vLLM V1 style, one rank).

Each step has a token budget of ``max_num_batched_tokens``. Running decodes are
scheduled first (one token each), then the unfinished prefill of running
requests, then waiting requests are admitted while fewer than ``max_num_seqs``
run. With chunked prefill a prompt is split into chunks of at most the
remaining budget; a chunk after the first has cached tokens — a *continuation
prefill*.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field

from ..config import EngineConfig

__all__ = ["BlockPool", "Request", "RequestStatus", "Scheduler", "SchedulerOutput"]


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Request:
    """One request. ``prompt_token_ids`` may be None on the meta device (length only)."""

    request_id: int
    prompt_len: int
    max_tokens: int
    prompt_token_ids: list[int] | None = None
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
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
    """Free list of KV-cache blocks. Block 0 is the null block (padding rows point at it)."""

    def __init__(self, num_blocks: int):
        if num_blocks < 2:
            raise ValueError(f"need at least 2 KV-cache blocks (one is the null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, 0, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise RuntimeError(f"out of KV-cache blocks: need {n}, {len(self._free)} free")
        return [self._free.pop() for _ in range(n)]

    def free(self, ids: list[int]) -> None:
        self._free.extend(reversed(ids))


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
        need = -(-upto_tokens // self.config.block_size)
        return max(0, need - len(req.block_ids))

    def _grow(self, req: Request, upto_tokens: int) -> None:
        req.block_ids += self.pool.allocate(self._blocks_for(req, upto_tokens))

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
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
        req.block_ids = []
        if req in self.running:
            self.running.remove(req)
