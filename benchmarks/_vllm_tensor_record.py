"""Fold one H200 call of ``benchmarks/record_vllm_tensor.sh`` into ``data/turboquant_vllm_tensor_h200.json``.

    python benchmarks/_vllm_tensor_record.py RUN_DIR --command "..." [--out data/turboquant_vllm_tensor_h200.json]

``RUN_DIR`` holds ``vllm_tensor.jsonl`` (anchor bench, tqlab on vLLM's own cache tensor), ``block_soa.jsonl`` (the
same with ``--tqlab-layout block_soa``) and ``vllm_checks.jsonl`` (the gpu test's comparison with vLLM's own store
and decode kernels).  Written: ``provenance`` (the bench's: device, date, commit, torch/triton/CUDA, plus the
command), ``copy`` (measured bandwidth), ``decode`` rows -- one per (shape, batch, ctx, preset) with ``sdpa_ms``,
``vllm_ms``, ``tqlab_ms`` / ``tqlab_kernel`` / ``tqlab_frac_of_byte_limit`` on vLLM's tensor, ``block_soa_ms`` /
``block_soa_kernel``, and the speed-ups over SDPA ``tqlab_x_sdpa`` / ``block_soa_x_sdpa`` (= sdpa_ms / ms) --,
``dequant`` rows (ms and ``share_of_copy`` bandwidth, vLLM's kernel and tqlab's) and ``vllm_checks``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _lines(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


def _key(r: dict) -> tuple:
    return (r["shape"], r["batch"], r["ctx"], r["preset"])


def fold(run: Path, command: str) -> dict:
    main, soa = _lines(run / "vllm_tensor.jsonl"), _lines(run / "block_soa.jsonl")
    prov = next(r for r in main if r.get("kind") == "provenance")
    soa_rows = {_key(r): r for r in soa if r.get("kind") == "decode"}
    rows = []
    for r in (x for x in main if x.get("kind") == "decode"):
        sd, vl, tq = r["sdpa_fp16"]["ms"], r["vllm_tq"]["ms"], r["tqlab"]
        so = soa_rows.get(_key(r), {}).get("tqlab", {})
        rows.append({"shape": r["shape"], "batch": r["batch"], "ctx": r["ctx"], "preset": r["preset"], "splits": r["splits"],
                     "byte_limit_ms": r["byte_limit_ms"], "sdpa_ms": sd, "vllm_ms": vl, "tqlab_ms": tq["ms"],
                     "tqlab_kernel": tq.get("kernel"), "tqlab_frac_of_byte_limit": tq["frac_of_byte_limit"],
                     "tqlab_x_sdpa": sd / tq["ms"], "block_soa_ms": so.get("ms"), "block_soa_kernel": so.get("kernel"),
                     "block_soa_x_sdpa": sd / so["ms"] if so.get("ms") else None,
                     "block_soa_frac_of_byte_limit": so.get("frac_of_byte_limit")})
    deq = [{"shape": r["shape"], "ctx": r.get("cached_len", r.get("ctx")), "preset": r["preset"],
            "vllm_ms": (r.get("vllm_kernel") or {}).get("ms"), "vllm_share_of_copy": (r.get("vllm_kernel") or {}).get("share_of_copy"),
            "tqlab_ms": (r.get("tqlab") or {}).get("ms"), "tqlab_share_of_copy": (r.get("tqlab") or {}).get("share_of_copy")}
           for r in main if r.get("kind") == "dequant"]
    return {"provenance": {**prov, "command": command}, "copy": next((r for r in main if r.get("kind") == "copy"), None),
            "decode": rows, "dequant": deq, "vllm_checks": _lines(run / "vllm_checks.jsonl")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--command", required=True)
    ap.add_argument("--out", type=Path, default=Path("data/turboquant_vllm_tensor_h200.json"))
    a = ap.parse_args()
    a.out.write_text(json.dumps(fold(a.run, a.command), indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
