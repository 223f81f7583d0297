"""What every modelled workspace consumer says about itself, and the sizes it asks for.

A consumer is one vLLM 0.33 call site family (``current_workspace_manager().get_simultaneous(...)``)
with: its call site as vLLM's lock assertion names it (``consumer``, ``file.py:function``), the vLLM
source it mirrors (``source``, cited in each module's docstring), the config fields it reads
(``reads``), whether a deployment uses it (:meth:`Consumer.active`) and its requests
(:meth:`Consumer.sizes`): the calls it makes before the lock (``reserved``, with the ``phase`` that
makes them: ``init`` = a builder's/impl's ``__init__``; ``profile_run`` = ``_dummy_run(max_num_batched_tokens,
is_profile=True)``; ``capture``; ``none``) and its largest call at serve time under the configured
limits (``runtime``). Bytes follow vLLM's ``get_simultaneous``: ``sum(round_up(nbytes_i, 256))`` per call
(:func:`tqlab.core.workspace.compute_layout`); a slot is as large as the largest single call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from tqlab.core.workspace_layout import compute_layout

if TYPE_CHECKING:  # pragma: no cover
    from tqlab.core.config import EngineConfig
    from tqlab.core.reservation import Shapes

__all__ = ["PHASES", "REACHED", "Consumer", "ConsumerSizes", "StartUp", "call_bytes", "largest_call_bytes"]

PHASES = ("init", "profile_run", "kernel_warmup", "jit_warmup_v2", "capture", "none")
"""Phases before vLLM 0.33's ``lock_workspace()`` (``gpu_model_runner.py`` ``capture_model``), in the order they run."""


REACHED = ("prefill", "context", "decode")
"""When a request first reaches a consumer's serve-time call (:attr:`Consumer.reached`): ``prefill`` = any
forward step with a prefill (a request's first step); ``context`` = the first step with cached context (its
second prefill chunk, else its first decode step); ``decode`` = its first decode step."""


def call_bytes(call: "Shapes") -> int:
    """Bytes one ``get_simultaneous(*call)`` needs: ``sum(round_up(prod(shape) * itemsize, 256))``."""
    return compute_layout(call).total_bytes


def largest_call_bytes(calls: list["Shapes"]) -> int:
    """The slot size ``calls`` need: the largest single call (separate calls alias the same bytes); 0 for none."""
    return max((call_bytes(c) for c in calls), default=0)


@dataclass(frozen=True)
class StartUp:
    """How start-up runs, as the caller resolved it (``tqlab.predict.analysis`` ``cudagraph_mode`` and
    ``locks_workspace``): ``cudagraph_mode`` (``NONE`` when eager) and ``locks`` (start-up ends with
    ``lock_workspace()``)."""

    cudagraph_mode: str = "FULL_AND_PIECEWISE"
    locks: bool = True

    @property
    def captures_full(self) -> bool:
        """FULL graphs are captured (their capture builds attention metadata): FULL, FULL_DECODE_ONLY, FULL_AND_PIECEWISE."""
        return self.cudagraph_mode in ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


@dataclass(frozen=True)
class ConsumerSizes:
    """One consumer's requests for one deployment.

    ``phase``: the first phase before the lock that makes ``reserved`` (``none``: nothing before the lock).
    ``reserved``: the calls made before the lock; ``runtime``: the largest call(s) at serve time.
    ``slot``: which workspace slot the reservation lands in (``init`` reservations: ubatch 0, lane 0 only).
    """

    phase: str
    reserved: list = field(default_factory=list)
    runtime: list = field(default_factory=list)
    slot: str = "ubatch 0, lane 0"

    @property
    def reserved_bytes(self) -> int:
        return largest_call_bytes(self.reserved)

    @property
    def max_runtime_bytes(self) -> int:
        return largest_call_bytes(self.runtime)


class Consumer:
    """Base of the registry's entries; subclasses set the class attributes and the two methods."""

    name: ClassVar[str]
    consumer: ClassVar[str]
    source: ClassVar[str]
    reads: ClassVar[tuple[str, ...]]
    reached: ClassVar[str] = "prefill"
    """One of :data:`REACHED`: the first step of a request alone that makes the serve-time call (the predictor
    orders refused calls by it, :func:`tqlab.predict.analysis.predict`)."""

    def active(self, config: "EngineConfig") -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def sizes(self, config: "EngineConfig", startup: StartUp) -> ConsumerSizes:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<consumer {self.name}: {self.consumer}>"
