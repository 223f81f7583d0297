"""The attention backend's workspace client, and the one way to put a wrapper in front of the manager.

The backend (``tqlab/attention/turboquant_attn.py``) calls only
``get_simultaneous`` on its workspace. A wrapper (capture's recorder, a
simulated replay's frozen views, a strategy's fallback) implements exactly that
(:class:`WorkspaceClient`), is put in place with :class:`set_workspace`, and
names the real consumer through :func:`tqlab.core.workspace.workspace_wrapper`.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import torch

from tqlab.core.workspace import current_ubatch_id, workspace_wrapper

__all__ = ["CaptureRecorder", "FrozenWorkspace", "WorkspaceClient", "set_workspace"]


class WorkspaceClient(Protocol):
    """What the attention backend calls on its workspace: the manager, or a wrapper in front of it.

    ``TurboQuantAttentionBackend`` (``tqlab/attention/turboquant_attn.py``) calls
    only ``get_simultaneous``, so a wrapper implements exactly that. A wrapper
    that passes calls on marks it with :func:`tqlab.core.workspace.workspace_wrapper`,
    so the manager's errors and events name the consumer, not the wrapper.
    """

    def get_simultaneous(self, *shapes_and_dtypes: tuple[Sequence[int], torch.dtype]) -> list[torch.Tensor]: ...


class set_workspace:
    """Route ``backend``'s workspace calls through ``client`` (the one way to put a wrapper in place).

    Takes effect at once. Used as ``with set_workspace(backend, client):`` it
    puts the previous client back on exit, even if the body raises (capture,
    simulated replay); called alone it stays (a strategy's wrapper for the life
    of the engine, ``tqlab.strategies.fixes``). The model runner keeps the
    manager itself (``ModelRunner.workspace``), so the guard reads real pointers.

    Raises ``TypeError`` if ``client`` has no ``get_simultaneous``.
    """

    def __init__(self, backend: Any, client: WorkspaceClient):
        if not callable(getattr(client, "get_simultaneous", None)):
            raise TypeError(f"a workspace client needs get_simultaneous(), got {type(client).__name__}")
        self.backend = backend
        self.client = client
        self.previous: WorkspaceClient = backend.workspace
        backend.workspace = client

    def __enter__(self) -> WorkspaceClient:
        return self.client

    def __exit__(self, *exc: object) -> bool:
        self.backend.workspace = self.previous
        return False


class CaptureRecorder:
    """The backend's workspace client during a capture: passes each call on and records it.

    ``calls``: ``(request signature, views)`` per call, in order; ``ptrs``: the
    views' ``data_ptr()`` per call; ``slots``: ubatch slots the calls used.
    """

    def __init__(self, inner: WorkspaceClient):
        self.inner = inner
        self.calls: list[tuple[tuple, list[torch.Tensor]]] = []
        self.ptrs: list[tuple[int, ...]] = []
        self.slots: set[int] = set()

    @workspace_wrapper  # the manager names the consumer, not this method
    def get_simultaneous(self, *reqs):
        views = self.inner.get_simultaneous(*reqs)
        self.calls.append((tuple((tuple(s), d) for s, d in reqs), list(views)))
        self.ptrs.append(tuple(v.data_ptr() for v in views))
        self.slots.add(current_ubatch_id())
        return views


class FrozenWorkspace:
    """The backend's workspace client during a simulated replay: hands out, in order, the views recorded at capture.

    Raises ``RuntimeError`` if the replay asks for more calls, or other shapes,
    than the capture recorded.
    """

    def __init__(self, calls: list[tuple[tuple, list[torch.Tensor]]]):
        self.calls = calls
        self.served = 0

    def get_simultaneous(self, *reqs):
        if self.served >= len(self.calls):
            raise RuntimeError(
                f"simulated replay asked the workspace {self.served + 1} times; the capture asked {len(self.calls)}")
        sig, views = self.calls[self.served]
        got = tuple((tuple(s), d) for s, d in reqs)
        if got != sig:
            raise RuntimeError(f"simulated replay call {self.served} asked for {got}, the capture recorded {sig}")
        self.served += 1
        return list(views)

