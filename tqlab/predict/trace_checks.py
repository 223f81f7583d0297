"""What ``tqlab trace-report`` questions before it believes a folder of vLLM plugin records.

Two parts, both pure functions over the records :mod:`tqlab.vllm.trace_record` writes:

* :func:`read_record_file` reads one ``*.json`` file only if it is a regular file below
  :data:`MAX_RECORD_BYTES` (a FIFO, a device such as ``/dev/zero`` behind a symlink, a folder or a
  huge file is skipped with one line, without blocking or reading it);
* :func:`record_problems` names records that disagree with each other -- vLLM version, the
  ``VllmConfig`` fields a record keeps, rank sizes, a duplicated or missing rank -- and
  :func:`config_disagreements` records whose config disagrees with the deployment ``--args``
  describe (an :class:`~tqlab.core.config.EngineConfig`).

Ranks are vLLM 0.33's group coordinators (``vllm/distributed/parallel_state.py`` ``_DP``/``_PP``/``_TP``,
``rank_in_group`` and ``world_size``): every (dp, pp, tp) rank of the sizes the records state
must appear exactly once.
"""

from __future__ import annotations

import itertools
import json
import os
import stat
from pathlib import Path
from typing import Any, Mapping, Sequence

MAX_RECORD_BYTES = 16 << 20
"""The largest record file read (bytes). A record is a few KiB per consumer; anything larger is not one."""

_RANK_GROUPS = ("dp", "pp", "tp")
# record["config"] key -> EngineConfig attribute, for the fields a deployment fixes (tqlab.vllm.trace_record)
_CONFIG_VS_ENGINE = (
    ("max_model_len", "max_model_len"), ("dtype", "dtype"), ("kv_cache_dtype", "kv_cache_dtype"),
    ("block_size", "block_size"), ("max_num_seqs", "max_num_seqs"), ("max_num_batched_tokens", "max_num_batched_tokens"),
    ("enable_chunked_prefill", "enable_chunked_prefill"), ("tensor_parallel_size", "tensor_parallel_size"),
    ("data_parallel_size", "data_parallel_size"), ("enable_dbo", "enable_dbo"),
    ("cudagraph_mode", "cudagraph_mode"), ("max_cudagraph_capture_size", "max_cudagraph_capture_size"),
)
# fields that differ between processes of one deployment by design
_PER_PROCESS = frozenset({"data_parallel_rank"})


def read_record_file(path: Path, cap: int = MAX_RECORD_BYTES) -> tuple[Any, str | None]:
    """``(parsed JSON, None)`` or ``(None, why it was skipped)`` for one file, never blocking.

    Opened with ``O_NONBLOCK`` (a FIFO opens at once) and checked with ``fstat`` on the open
    descriptor (no race with a swapped path): only a regular file of at most ``cap`` bytes
    is read, and at most ``cap + 1`` bytes of it (a file growing meanwhile is refused too).
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        return None, f"cannot open ({e.strerror})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, f"not a regular file ({_file_kind(st.st_mode)})"
        if st.st_size > cap:
            return None, f"{st.st_size:,} bytes, more than a record can be ({cap:,})"
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(cap + 1)
    except OSError as e:
        return None, f"cannot read ({e.strerror})"
    finally:
        os.close(fd)
    if len(data) > cap:
        return None, f"grew past {cap:,} bytes while read"
    try:
        return json.loads(data.decode("utf-8")), None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        return None, f"not readable JSON (truncated?): {str(e).splitlines()[0] if str(e) else type(e).__name__}"


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a plain file"


MAX_RANKS = 1 << 16
"""The most ranks (dp x pp x tp) a record may state: more is not a deployment (and would not be enumerated)."""


def field_problem(rec: Mapping[str, Any]) -> str | None:
    """Why ``rec``'s ``rank``, ``config`` or ``vllm_version`` cannot be read, else None: each ``rank`` group
    ``{"rank": r, "size": s}`` with whole numbers ``0 <= r < s``, dp x pp x tp at most :data:`MAX_RANKS`;
    ``config`` an object or null; ``vllm_version`` text or null."""
    rank = rec.get("rank") or {}
    if not isinstance(rank, dict):
        return f"rank {rank!r} is not an object"
    total = 1
    for group, v in rank.items():
        ok = isinstance(v, dict) and all(isinstance(v.get(k), int) and not isinstance(v.get(k), bool)
                                         for k in ("rank", "size"))
        if not ok or not 0 <= v["rank"] < v["size"]:
            return f"rank {group} {v!r} is not {{'rank': r, 'size': s}} with 0 <= r < s"
        total *= v["size"] if group in _RANK_GROUPS else 1
    if total > MAX_RANKS:
        return f"rank sizes make {total:,} ranks (more than {MAX_RANKS:,})"
    if rec.get("config") is not None and not isinstance(rec["config"], dict):
        return f"config {rec['config']!r} is not an object"
    if rec.get("vllm_version") is not None and not isinstance(rec["vllm_version"], str):
        return f"vllm_version {rec['vllm_version']!r} is not text"
    return None


def _norm(value: Any) -> Any:
    """A config value as text comparable across the record (JSON) and an EngineConfig (``torch.bfloat16``,
    ``CUDAGraphMode.FULL``): ``"bfloat16"``, ``"FULL"``."""
    if value is None or isinstance(value, (bool, int)):
        return value
    text = str(value).removeprefix("torch.")
    return text.rsplit(".", 1)[-1] if text.startswith("CUDAGraphMode.") else text


def _rank_tuple(rec: Mapping[str, Any]) -> tuple[int, ...] | None:
    rank = rec.get("rank") or {}
    if not all(k in rank for k in _RANK_GROUPS):
        return None
    return tuple(int(rank[k]["rank"]) for k in _RANK_GROUPS)


def _sizes(rec: Mapping[str, Any]) -> tuple[int, ...] | None:
    rank = rec.get("rank") or {}
    if not all(k in rank for k in _RANK_GROUPS):
        return None
    return tuple(int(rank[k]["size"]) for k in _RANK_GROUPS)


def _label(ranks: Sequence[int], sizes: Sequence[int]) -> str:
    return " ".join(f"{g.upper()} {r}/{s}" for g, r, s in zip(_RANK_GROUPS, ranks, sizes))


def record_problems(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per way the records disagree with each other (``[]``: they describe one deployment).

    vLLM versions differ; a config field (other than ``data_parallel_rank``) differs from the first
    record's; rank sizes differ; a (dp, pp, tp) rank is recorded twice; a rank of the stated sizes has
    no record; a record states no vLLM rank while others do.
    """
    if not records:
        return []
    out = []
    versions: dict[str, list[str]] = {}
    for r in records:
        versions.setdefault(str(r.get("vllm_version")), []).append(r["file"])
    if len(versions) > 1:
        out.append("records ran different vLLM versions: "
                   + "; ".join(f"{v} ({', '.join(files)})" for v, files in sorted(versions.items())))
    first = records[0]
    for r in records[1:]:
        a, b = first.get("config") or {}, r.get("config") or {}
        diff = [k for k in sorted(set(a) | set(b)) if k not in _PER_PROCESS and _norm(a.get(k)) != _norm(b.get(k))]
        if diff:
            out.append(f"{r['file']}'s config differs from {first['file']}'s in "
                       + ", ".join(f"{k} ({_norm(b.get(k))!r} vs {_norm(a.get(k))!r})" for k in diff))
    out += _rank_set_problems(records)
    return out


def _rank_set_problems(records: Sequence[Mapping[str, Any]]) -> list[str]:
    out = []
    unranked = [r["file"] for r in records if _rank_tuple(r) is None]
    ranked = [r for r in records if _rank_tuple(r) is not None]
    if unranked and (ranked or len(unranked) > 1):
        out.append(f"no vLLM rank in {', '.join(unranked)} (written before vLLM set its parallel groups): "
                   "the rank set cannot be checked")
    sizes = {_sizes(r) for r in ranked}
    if len(sizes) > 1:
        out.append("records state different parallel sizes (dp, pp, tp): "
                   + "; ".join(f"{s} ({', '.join(r['file'] for r in ranked if _sizes(r) == s)})" for s in sorted(sizes)))
        return out
    seen: dict[tuple[int, ...], list[str]] = {}
    for r in ranked:
        seen.setdefault(_rank_tuple(r), []).append(r["file"])
    for rank, files in sorted(seen.items()):
        if len(files) > 1:
            out.append(f"rank {_label(rank, next(iter(sizes)))} recorded {len(files)} times ({', '.join(files)})")
    if sizes:
        (size,) = sizes
        missing = [rk for rk in itertools.product(*(range(s) for s in size)) if rk not in seen]
        if missing:
            shown = ", ".join(_label(rk, size) for rk in missing[:8]) + (" ..." if len(missing) > 8 else "")
            out.append(f"{len(missing)} of {_prod(size)} ranks have no record: {shown}")
    return out


def _prod(xs: Sequence[int]) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


def config_disagreements(records: Sequence[Mapping[str, Any]], config: Any, model: str | None = None) -> list[str]:
    """One line per record field that contradicts the deployment (``config``: an EngineConfig; ``model``: the
    model ``--args`` names, if any). A field the record lacks or leaves None, or the deployment leaves to vLLM
    (``cudagraph_mode``/``max_cudagraph_capture_size`` None), is not compared; the record's tensor-parallel size
    (vLLM's ``_TP`` group) is compared with ``tensor_parallel_size``."""
    out = []
    for r in records:
        rc = r.get("config") or {}
        bad = []
        if model is not None and rc.get("model") not in (None, model) and Path(str(rc["model"])).name != Path(model).name:
            bad.append(f"model {rc['model']!r} (--args: {model!r})")
        for key, attr in _CONFIG_VS_ENGINE:
            want, got = _norm(getattr(config, attr, None)), _norm(rc.get(key))
            if want is not None and got is not None and want != got:
                bad.append(f"{key} {got!r} (--args: {want!r})")
        tp = (r.get("rank") or {}).get("tp")
        if isinstance(tp, Mapping) and tp.get("size") != config.tensor_parallel_size and "tensor_parallel_size" not in rc:
            bad.append(f"TP size {tp.get('size')} (--args: {config.tensor_parallel_size})")
        if bad:
            out.append(f"{r['file']} ran a different deployment: " + ", ".join(bad))
    return out


def model_in_args(engine_args: str | Sequence[str] | None) -> str | None:
    """The model a ``vllm serve MODEL ...`` line (or ``--model M``) names, else None."""
    import shlex

    if engine_args is None:
        return None
    toks = shlex.split(engine_args) if isinstance(engine_args, str) else list(engine_args)
    for i, t in enumerate(toks):
        if t == "--model" and i + 1 < len(toks):
            return toks[i + 1]
        if t.startswith("--model="):
            return t.split("=", 1)[1]
    if len(toks) >= 3 and toks[0].endswith("vllm") and toks[1] == "serve" and not toks[2].startswith("-"):
        return toks[2]
    return None
