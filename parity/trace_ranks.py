"""Two vLLM "ranks" traced by tqlab's vLLM plugin, on CPU: the parity test's driver and the recorder of data/trace_two_ranks/.

Each rank is a process started with ``multiprocessing``'s spawn method (as vLLM's
multiproc executor starts its workers) and ``TQLAB_VLLM_TRACE`` set. In each one:

1. vLLM's own ``vllm.plugins.load_general_plugins()`` finds the ``tqlab_trace`` entry
   point (the project must be installed in this venv) and calls it;
2. vLLM's parallel state is initialised with ``gloo`` on CPU, tensor parallel 2
   (``init_distributed_environment`` + ``initialize_model_parallel``, inside
   ``set_current_vllm_config`` as a worker does), so vLLM knows each rank;
3. :func:`tqlab.vllm.run_vllm_seed_scenario` replays the bug report's requests through
   vLLM's own ``WorkspaceManager`` and TurboQuant code: split-KV decode warm-up at
   ``max_num_seqs`` rows, ``lock()``, one continuation chunk of 129 tokens after 4096
   cached ones, which vLLM refuses with its ``AssertionError``;
4. rank 1 then dies with ``os._exit`` (no ``atexit``, as a crashed engine): its record
   is what the plugin flushed before the assertion propagated. Rank 0 exits normally.

Record (writes ``data/trace_two_ranks/`` and its provenance, ``data/trace_two_ranks.json``)::

    PARITY_VENV=... .venv-parity/bin/python parity/trace_ranks.py --record
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import shutil
import socket
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
PRESET = "nemotron-3-super-120b-a12b"
ENGINE_ARGS = "vllm serve nvidia/NVIDIA-Nemotron-3-Super-120B-A12B --tensor-parallel-size 2"
CACHED_LEN = 4096  # the bug report's first continuation chunk: 129 new tokens after 4096 cached
WORLD = 2
RECORDED = ROOT / "data" / "trace_two_ranks"


def _vllm_config(config):
    """The stand-in VllmConfig of :func:`tqlab.vllm.fake_vllm_configs` with vLLM's real ``ParallelConfig``."""
    from vllm.config import ParallelConfig

    from tqlab.vllm import fake_vllm_configs

    cfg, _ = fake_vllm_configs(config)
    cfg.parallel_config = ParallelConfig(tensor_parallel_size=config.tensor_parallel_size)
    cfg.model_config.is_moe = False
    cfg.model_config.model = ENGINE_ARGS.split()[2]
    cfg.engram_config = None
    cfg.cache_config = SimpleNamespace(cache_dtype=config.kv_cache_dtype, block_size=config.block_size)
    return cfg


def rank_main(rank: int, port: int, trace_dir: str, out: "mp.Queue") -> None:
    """One rank (see the module docstring); puts ``(rank, plugin_loaded, error)`` on ``out``."""
    os.environ["TQLAB_VLLM_TRACE"] = trace_dir
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    from tqlab.vllm import run_vllm_seed_scenario, trace_record
    from tqlab.vllm.deployment import deployment_from_preset

    loaded = "recorder" in trace_record._RECORDER
    config = deployment_from_preset(ENGINE_ARGS, PRESET).config
    from vllm.config import set_current_vllm_config
    from vllm.distributed import parallel_state as ps

    with set_current_vllm_config(_vllm_config(config)):
        ps.init_distributed_environment(world_size=WORLD, rank=rank, local_rank=rank, backend="gloo",
                                        distributed_init_method=f"tcp://127.0.0.1:{port}")
        ps.initialize_model_parallel(tensor_model_parallel_size=WORLD, backend="gloo")
        res = run_vllm_seed_scenario(config, cached_len=CACHED_LEN)
    out.put((rank, loaded, res.error))
    if rank == 1:
        out.close()
        out.join_thread()  # the answer must reach the parent before the hard exit
        os._exit(3)  # a crashed engine: no atexit, no finally


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_ranks(trace_dir: str | os.PathLike, timeout: float = 240.0) -> dict[int, tuple[bool, str | None, int]]:
    """Run both ranks; ``{rank: (plugin_loaded, refusal message or None, exit code)}``."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=rank_main, args=(r, port, str(trace_dir), q)) for r in range(WORLD)]
    for p in procs:
        p.start()
    got = {}
    for _ in procs:
        rank, loaded, error = q.get(timeout=timeout)
        got[rank] = (loaded, error)
    for p in procs:
        p.join(timeout)
    return {r: (*got[r], procs[r].exitcode) for r in got}


def record(out_dir: Path = RECORDED) -> Path:
    """Run both ranks into ``out_dir`` (emptied first); provenance and outcome in ``<out_dir>.json``
    (``data/trace_two_ranks.json``, :func:`tqlab.core.provenance.load_recorded`)."""
    from tqlab.core.provenance import make_provenance, save_recorded
    from tqlab.vllm import vllm_version

    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    outcome = run_two_ranks(out_dir)
    prov = make_provenance("python parity/trace_ranks.py --record (in .venv-parity with tqlab installed)",
                           device=f"CPU ({platform.machine()}, {os.cpu_count()} cores)",
                           extra={"vllm": vllm_version() or "unknown"})
    save_recorded(out_dir.name, {
        "preset": PRESET, "engine_args": ENGINE_ARGS, "cached_len": CACHED_LEN, "world_size": WORLD,
        "records": sorted(p.name for p in out_dir.glob("*.json")),
        "what": " ".join(" ".join(__doc__.split("\n\n")[1:3]).split()),
        "outcome": {str(r): {"plugin_loaded": v[0], "refusal": v[1], "exit_code": v[2]} for r, v in outcome.items()},
    }, prov, out_dir.parent)
    return out_dir


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", action="store_true", help=f"write {RECORDED.relative_to(ROOT)}/")
    ap.add_argument("--out", default=None, help="folder for the records (default: build/trace_two_ranks)")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    d = RECORDED if a.record else Path(a.out or ROOT / "build" / "trace_two_ranks")
    if a.record:
        print(record(d))
    else:
        d.mkdir(parents=True, exist_ok=True)
        print(run_two_ranks(d))
