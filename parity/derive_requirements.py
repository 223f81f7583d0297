"""Derive the CPU-only runtime requirements of a vLLM wheel from its METADATA.

Usage: python parity/derive_requirements.py WHEEL > requirements.txt

Reads every ``Requires-Dist`` line of the wheel's ``*.dist-info/METADATA``,
drops those that only apply to an extra or whose environment marker is false
on this interpreter, and drops the packages that are CUDA builds, GPU kernels
or media codecs (listed in ``EXCLUDED`` with the reason).  The parity suite
only imports vLLM's pure-Python modules (``vllm.v1.worker.workspace``,
``vllm.v1.attention.backends.turboquant_attn`` and what they import), so
none of the excluded packages is ever loaded.  torch itself is excluded: the
parity venv keeps the CPU build torch==2.13.0.
"""

from __future__ import annotations

import re
import sys
import zipfile

try:  # pip vendors packaging; prefer a real install when present
    from packaging.requirements import Requirement
except ImportError:  # pragma: no cover
    from pip._vendor.packaging.requirements import Requirement

#: package name (normalized) -> why it is left out
EXCLUDED: dict[str, str] = {
    "torch": "kept at the CPU build torch==2.13.0 (the wheel pins a CUDA build)",
    "torchaudio": "pins a CUDA torch; audio only",
    "torchvision": "pins a CUDA torch; vision models only",
    "torchcodec": "media decoding, needs FFmpeg and a matching torch",
    "pynvvideocodec": "NVIDIA video codec",
    "flashinfer-python": "CUDA attention kernels",
    "apache-tvm-ffi": "GPU kernel JIT runtime (flashinfer/tilelang)",
    "tilelang": "GPU kernel DSL",
    "nvidia-cudnn-frontend": "CUDA",
    "nvtx": "NVIDIA profiling ranges",
    "fastsafetensors": "GPU-direct weight loading",
    "instanttensor": "GPU weight loading",
    "nvidia-cutlass-dsl": "CUDA kernel DSL",
    "quack-kernels": "CUDA kernels",
    "tokenspeed-mla": "CUDA MLA kernels",
    "humming-kernels": "CUDA kernels",
    "xformers": "CUDA kernels",
    "triton": "GPU kernel compiler (vllm.triton_utils has a CPU placeholder)",
}

_NVIDIA = re.compile(r"^(nvidia-|cuda-|cupy)")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_metadata(wheel: str) -> str:
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        if len(names) != 1:
            raise ValueError(f"{wheel!r}: expected one dist-info/METADATA, found {names}")
        return zf.read(names[0]).decode("utf-8")


def derive(metadata: str) -> tuple[list[str], list[tuple[str, str]]]:
    """Return (kept requirement strings, [(dropped requirement, reason)])."""
    kept: list[str] = []
    dropped: list[tuple[str, str]] = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        name = normalize(req.name)
        marker = req.marker
        if marker is not None and "extra" in str(marker):
            if not marker.evaluate({"extra": ""}):
                dropped.append((str(req), "optional extra"))
                continue
        if marker is not None and not marker.evaluate({"extra": ""}):
            dropped.append((str(req), "marker false here"))
            continue
        if name in EXCLUDED:
            dropped.append((str(req), EXCLUDED[name]))
            continue
        if _NVIDIA.match(name):
            dropped.append((str(req), "NVIDIA/CUDA package"))
            continue
        req.marker = None
        kept.append(str(req))
    return kept, dropped


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    kept, dropped = derive(read_metadata(argv[1]))
    print(f"# derived from {argv[1].rsplit('/', 1)[-1]} by parity/derive_requirements.py")
    for req, why in dropped:
        print(f"# dropped: {req}  ({why})")
    for req in kept:
        print(req)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
