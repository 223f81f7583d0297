"""Torch-free dtypes: a name and an item size, for the arithmetic that only counts bytes.

``tqlab inspect-vllm`` and ``tqlab plan`` only count: a workspace request is ``prod(shape) *
dtype.itemsize`` rounded up to 256 bytes (``WorkspaceManager.get_simultaneous``,
``vllm/v1/worker/workspace.py``). Importing torch to learn that ``float32`` has 4 bytes costs about a
second, so the shapes every consumer and the reservation build carry a :class:`DType` stand-in
(:data:`float32`, :data:`float16`, :data:`bfloat16`, ...), and torch is imported only where a real tensor is
made (the workspace manager's views, the engine, the kernels), through :func:`as_torch`.

A :class:`DType` prints as torch prints its dtype (``torch.float32``) and compares equal to the torch dtype
of the same name (``DType('float32', 4) == torch.float32``), so a recorded vLLM call and a predicted one
compare as before. Its hash is its name's: do not mix stand-ins and torch dtypes as keys of one dict.
Every function here accepts either kind.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DType", "as_torch", "bfloat16", "by_name", "dtype_name", "float16", "float32", "float64",
    "float8_e4m3fn", "int32", "int64", "int8", "is_dtype", "is_torch_dtype", "itemsize", "standin", "torch_call", "uint8",
]


@dataclass(frozen=True, eq=False)
class DType:
    """A torch dtype without torch: ``name`` as torch spells it (``"bfloat16"``) and ``itemsize`` in bytes."""

    name: str
    itemsize: int

    def __str__(self) -> str:
        return f"torch.{self.name}"

    __repr__ = __str__

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DType):
            return self.name == other.name
        if is_torch_dtype(other):
            return str(other) == str(self)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(("tqlab.core.dtypes.DType", self.name))


float64 = DType("float64", 8)
float32 = DType("float32", 4)
float16 = DType("float16", 2)
bfloat16 = DType("bfloat16", 2)
float8_e4m3fn = DType("float8_e4m3fn", 1)
int64 = DType("int64", 8)
int32 = DType("int32", 4)
int8 = DType("int8", 1)
uint8 = DType("uint8", 1)

_BY_NAME = {d.name: d for d in (float64, float32, float16, bfloat16, float8_e4m3fn, int64, int32, int8, uint8)}


def is_torch_dtype(value: Any) -> bool:
    """Whether ``value`` is a ``torch.dtype``; never imports torch (no torch loaded: no torch dtype exists)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, getattr(torch, "dtype", ()))


def is_dtype(value: Any) -> bool:
    """Whether ``value`` is a dtype a workspace request may carry: a :class:`DType` or a ``torch.dtype``."""
    return isinstance(value, DType) or is_torch_dtype(value)


def by_name(name: str) -> DType:
    """The stand-in named ``name`` (``"float32"``, ``"torch.float32"``); ``ValueError`` naming it if unknown."""
    key = name.removeprefix("torch.") if isinstance(name, str) else name
    if key not in _BY_NAME:
        raise ValueError(f"dtype {name!r} is not one of {', '.join(_BY_NAME)}")
    return _BY_NAME[key]


def standin(dtype: Any) -> DType:
    """``dtype`` (a :class:`DType`, a ``torch.dtype`` or its name) as a :class:`DType`; the item size is
    torch's own when a torch dtype is given. ``TypeError`` for anything else, ``ValueError`` for an unknown name."""
    if isinstance(dtype, DType):
        return dtype
    if is_torch_dtype(dtype):
        name = str(dtype).removeprefix("torch.")
        return _BY_NAME.get(name) or DType(name, dtype.itemsize)
    if isinstance(dtype, str):
        return by_name(dtype)
    raise TypeError(f"expected a dtype (tqlab.core.dtypes.DType or torch.dtype), got {dtype!r}")


def itemsize(dtype: Any) -> int:
    """Bytes per element of a :class:`DType` or a ``torch.dtype`` (torch's ``dtype.itemsize``)."""
    return dtype.itemsize


def dtype_name(dtype: Any) -> str:
    """``"float32"`` for ``torch.float32`` or its stand-in."""
    return str(dtype).removeprefix("torch.")


def as_torch(dtype: Any):
    """The ``torch.dtype`` for a :class:`DType` (or a torch dtype, returned as is). Imports torch: call it only
    where a real tensor is made."""
    if isinstance(dtype, DType):
        import torch

        return getattr(torch, dtype.name)
    if is_torch_dtype(dtype):
        return dtype
    raise TypeError(f"expected a dtype (tqlab.core.dtypes.DType or torch.dtype), got {dtype!r}")


def torch_call(call) -> tuple:
    """One ``get_simultaneous`` call's ``(shape, dtype)`` pairs with every dtype as torch's (:func:`as_torch`), for a
    manager that makes views with torch alone (vLLM's own ``WorkspaceManager``). Imports torch."""
    return tuple((shape, as_torch(dt)) for shape, dt in call)
