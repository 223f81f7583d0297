"""Generate ``data/vllm_<ver>_arch_consumers.json``: every architecture of vLLM's model registry -> its model
class -> the workspace consumers its layers can reach, and the ``config.json`` fields that code reads for them.

Run with any Python (vLLM's source is parsed with :mod:`ast`, never imported)::

    python parity/gen_arch_consumers.py [--vllm-root DIR] [--check]

``DIR`` defaults to the ``vllm`` package of the interpreter that runs it (``importlib.util.find_spec``; the
parity venv's), e.g. ``--vllm-root /work/vsrc/0.33/vllm``. The output file is named by the version in the
package's ``*.dist-info/METADATA`` (``0.33.0`` -> ``data/vllm_0_33_arch_consumers.json``).

What it reads (vLLM 0.33):

* ``vllm/model_executor/models/registry.py``: the dict literals of :data:`TABLES` (``arch: (module, class)``;
  a module without a dot is ``vllm.model_executor.models.<module>``, as ``_LazyRegisteredModel`` resolves it).
  An architecture in several tables keeps ``_VLLM_MODELS``'s entry (the later table's) and lists them all
  (``tables``). ``_TRANSFORMERS_*`` tables map to the Transformers modelling backend, whose layers are built
  from the HF model at run time: they are listed with ``markers: null`` (unknown statically).
* From the model class, a closure over the names its code references (base classes, classes it
  builds, functions it calls), resolved through each module's imports and re-exports (package ``__init__``), kept to
  the model and layer code (:data:`WALK`). Platform dispatch (``if current_platform.is_rocm(): ... else:``)
  follows the CUDA branch. The walk stops at the layer classes of :data:`MARKERS` (their workspace consumers
  are chosen at run time: the attention backend by vLLM's selector, the fused-MoE experts class by the MoE
  oracle, the language model of ``init_vllm_registered_model`` by the config) and records them; inside
  every other reached class or function it records each ``get_simultaneous`` / ``get_persistent`` /
  ``get_persistent_resource`` call as vLLM's lock assertion names it (``file.py:function``), with its path.
* ``_PREVIOUSLY_SUPPORTED_MODELS`` (arch -> the last vLLM version that ran it), which vLLM refuses by name.
* Per marker, the ``config`` attributes the reached model code reads (``config.X``, ``getattr(config, "X")`` on
  any name containing ``config``) that match the marker's field pattern (fused MoE: expert counts, top-k,
  intermediate sizes).
"""

from __future__ import annotations

import argparse
import ast
import datetime as _dt
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CALLS = ("get_simultaneous", "get_persistent", "get_persistent_resource")
TABLES = ("_TEXT_GENERATION_MODELS", "_EMBEDDING_MODELS", "_LATE_INTERACTION_MODELS", "_REWARD_MODELS",
          "_TOKEN_CLASSIFICATION_MODELS", "_SEQUENCE_CLASSIFICATION_MODELS", "_MULTIMODAL_MODELS",
          "_SPECULATIVE_DECODING_MODELS", "_TRANSFORMERS_SUPPORTED_MODELS", "_TRANSFORMERS_BACKEND_MODELS")
"""The registry's tables, in ``_VLLM_MODELS``'s order (a later table's entry wins, as in the dict merge)."""
WALK = ("model_executor/models/", "models/", "model_executor/layers/")
"""Where the walk descends (model and layer code); references elsewhere are not followed."""
MARKERS = {
    "model_executor/layers/fused_moe/layer.py:FusedMoEFactory": "fused_moe",
    "model_executor/layers/attention/attention.py:Attention": "attention",
    "model_executor/layers/attention/encoder_only_attention.py:EncoderOnlyAttention": "encoder_only_attention",
    "model_executor/layers/attention/mla_attention.py:MLAAttention": "mla_attention",
    "model_executor/layers/mla.py:MultiHeadLatentAttentionWrapper": "mla_attention",
    "model_executor/layers/sparse_attn_indexer.py:SparseAttnIndexer": "sparse_indexer",
    "model_executor/models/utils.py:init_vllm_registered_model": "dynamic_submodel",
}
"""Layer class/function -> the consumer family it stands for (the walk does not descend into it)."""
FIELD_PATTERNS = {
    "fused_moe": re.compile(r"expert|moe|topk|top_k|intermediate"),
    "sparse_indexer": re.compile(r"^index_"),
    "mla_attention": re.compile(r"lora_rank|_head_dim$"),
}
"""Per marker, which ``config`` attributes the model code reads are recorded as its fields."""


def default_vllm_root() -> Path:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("no vllm package in this interpreter: pass --vllm-root DIR")
    return Path(list(spec.submodule_search_locations)[0])


def vllm_version(root: Path) -> str:
    for meta in sorted(root.parent.glob("vllm-*.dist-info/METADATA")):
        for line in meta.read_text(encoding="utf-8").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def out_path(version: str) -> Path:
    major_minor = "_".join(version.split(".")[:2])
    return ROOT / "data" / f"vllm_{major_minor}_arch_consumers.json"


def _is_platform_test(test: ast.AST) -> bool | None:
    """True: a CUDA test (take the body); False: another platform's (take ``orelse``); None: not a platform test."""
    names = {n.attr for n in ast.walk(test) if isinstance(n, ast.Attribute)}
    if not any("platform" in ast.unparse(n) for n in ast.walk(test) if isinstance(n, ast.Attribute)):
        return None
    if names & {"is_cuda", "is_cuda_alike"}:
        return True
    if names & {"is_rocm", "is_xpu", "is_cpu", "is_tpu", "is_out_of_tree"}:
        return False
    return None


def _flatten(body: list[ast.stmt]) -> list[ast.stmt]:
    """Module statements with platform ``if``s resolved to the CUDA branch and ``try``/other ``if``s inlined."""
    out: list[ast.stmt] = []
    for s in body:
        if isinstance(s, ast.If):
            cuda = _is_platform_test(s.test)
            out += _flatten(s.body) if cuda in (True, None) else []
            out += _flatten(s.orelse) if cuda in (False, None) else []
        elif isinstance(s, ast.Try):
            out += _flatten(s.body + [x for h in s.handlers for x in h.body] + s.orelse)
        else:
            out.append(s)
    return out


class Index:
    """vLLM's modules, parsed on demand: top-level definitions and imported names per module."""

    def __init__(self, root: Path) -> None:
        self.root, self._mods = root, {}

    def path_of(self, dotted: str) -> str | None:
        parts = dotted.split(".")
        if parts[0] != "vllm":
            return None
        rel = "/".join(parts[1:])
        for cand in (f"{rel}.py", f"{rel}/__init__.py"):
            if (self.root / cand).is_file():
                return cand.lstrip("/")
        return None

    def module(self, rel: str) -> tuple[dict, dict, str]:
        """``(defs: name -> node, imports: name -> (dotted module, attr | None), dotted package)`` of ``rel``."""
        if rel in self._mods:
            return self._mods[rel]
        tree = ast.parse((self.root / rel).read_text(encoding="utf-8"), filename=rel)
        pkg = "vllm." + rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        if not rel.endswith("__init__.py"):
            pkg = pkg.rsplit(".", 1)[0]
        defs, imports = {}, {}
        for s in _flatten(tree.body):
            if isinstance(s, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                defs[s.name] = s
            elif isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name):
                defs.setdefault(s.targets[0].id, s)
            elif isinstance(s, ast.Import):
                for a in s.names:
                    imports[a.asname or a.name.split(".")[0]] = (a.name if a.asname else a.name.split(".")[0], None)
            elif isinstance(s, ast.ImportFrom):
                base = s.module or ""
                if s.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - (s.level - 1)]
                    base = ".".join(up + ([s.module] if s.module else []))
                for a in s.names:
                    imports[a.asname or a.name] = (base, a.name)
        self._mods[rel] = (defs, imports, pkg)
        return self._mods[rel]

    def resolve(self, rel: str, name: str, depth: int = 0) -> tuple[str, str] | tuple[str, None] | None:
        """``(path, name)`` of the definition ``name`` means in module ``rel``, ``(path, None)`` for a module."""
        if depth > 12:
            return None
        defs, imports, _ = self.module(rel)
        if name in defs:
            return rel, name
        if name not in imports:
            return None
        mod, attr = imports[name]
        if attr is None:
            p = self.path_of(mod)
            return (p, None) if p else None
        sub = self.path_of(f"{mod}.{attr}")
        if sub is not None and not (self.path_of(mod) and attr in self.module(self.path_of(mod))[0]):
            return sub, None
        p = self.path_of(mod)
        return None if p is None else self.resolve(p, attr, depth + 1)


def _refs(node: ast.AST) -> set[tuple[str, ...]]:
    """Names (``("X",)``) and module attributes (``("mod", "X")``) a definition references."""
    out: set[tuple[str, ...]] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            out.add((n.id,))
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name):
            out.add((n.value.id, n.attr))
    return out


def _config_attrs(node: ast.AST) -> set[str]:
    """Attributes read off a config object: ``<...config...>.X`` and ``getattr(<...config...>, "X", ...)``."""
    def is_cfg(v: ast.AST) -> bool:
        return ((isinstance(v, ast.Name) and "config" in v.id.lower())
                or (isinstance(v, ast.Attribute) and "config" in v.attr.lower()))
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and is_cfg(n.value):
            out.add(n.attr)
        elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "hasattr")
              and len(n.args) >= 2 and is_cfg(n.args[0]) and isinstance(n.args[1], ast.Constant)
              and isinstance(n.args[1].value, str)):
            out.add(n.args[1].value)
    return out


def _call_sites(node: ast.AST, rel: str, stack: list[str], out: set[tuple[str, str]]) -> None:
    for child in ast.iter_child_nodes(node):
        named = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and child.func.attr in CALLS:
            fn = stack[-1] if stack else "<module>"
            out.add((f"{Path(rel).name}:{fn}", rel))
        _call_sites(child, rel, stack + [child.name] if named else stack, out)


def walk(index: Index, rel: str, name: str) -> dict:
    """The closure from ``rel:name``: ``markers`` reached, workspace ``call_sites``, config attrs per marker."""
    seen, todo = set(), [(rel, name)]
    markers, sites, attrs = set(), set(), set()
    while todo:
        key = todo.pop()
        if key in seen:
            continue
        seen.add(key)
        path, nm = key
        if f"{path}:{nm}" in MARKERS:
            markers.add(MARKERS[f"{path}:{nm}"])
            continue
        node = index.module(path)[0][nm]
        if path.startswith(("model_executor/models/", "models/")):
            attrs |= _config_attrs(node)
        _call_sites(node, path, [nm], sites)
        for ref in _refs(node):
            hit = index.resolve(path, ref[0])
            if hit is None:
                continue
            if hit[1] is None and len(ref) == 2:  # module.attr
                hit = index.resolve(hit[0], ref[1]) if hit[0] else None
                if hit is None:
                    continue
            if hit[1] is not None and hit[0].startswith(WALK):
                todo.append(hit)
    fields = {m: sorted(a for a in attrs if FIELD_PATTERNS[m].search(a)) for m in sorted(markers) if m in FIELD_PATTERNS}
    return {"markers": sorted(markers), "call_sites": [{"consumer": c, "path": p} for c, p in sorted(sites)],
            "config_fields": fields}


def registry_tables(root: Path) -> dict[str, dict[str, tuple[str, str]]]:
    """``{table: {arch: (module, class)}}`` from the dict literals of ``model_executor/models/registry.py``."""
    tree = ast.parse((root / "model_executor/models/registry.py").read_text(encoding="utf-8"))
    out: dict[str, dict[str, tuple[str, str]]] = {}
    for s in tree.body:
        if (isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name)
                and s.targets[0].id in TABLES and isinstance(s.value, ast.Dict)):
            table = {}
            for k, v in zip(s.value.keys, s.value.values):
                if k is None:  # a ** merge of another table
                    continue
                mod, cls = ast.literal_eval(v)[:2]
                table[ast.literal_eval(k)] = (mod if mod.startswith("vllm.") else f"vllm.model_executor.models.{mod}", cls)
            out[s.targets[0].id] = table
    return out


def previously_supported(root: Path) -> dict[str, str]:
    """``{arch: last version}``: ``model_executor/models/registry.py`` ``_PREVIOUSLY_SUPPORTED_MODELS``, which
    ``_ModelRegistry._raise_for_unsupported`` quotes when it refuses one of them."""
    tree = ast.parse((root / "model_executor/models/registry.py").read_text(encoding="utf-8"))
    for s in tree.body:
        if (isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name)
                and s.targets[0].id == "_PREVIOUSLY_SUPPORTED_MODELS"):
            return dict(sorted(ast.literal_eval(s.value).items()))
    return {}


def generate(root: Path) -> dict:
    """The table (without provenance): ``vllm_version``, ``tables``, ``markers``, ``architectures``,
    ``previously_supported`` (:func:`previously_supported`)."""
    index = Index(root)
    archs: dict[str, dict] = {}
    tables = registry_tables(root)
    winner: dict[str, tuple[str, tuple[str, str]]] = {}  # _VLLM_MODELS merges the tables: a later entry wins
    for table in TABLES:
        for arch, entry in tables.get(table, {}).items():
            winner[arch] = (table, entry)
    for arch, (table, (mod, cls)) in sorted(winner.items()):
        rec = {"tables": [t for t in TABLES if arch in tables.get(t, {})], "module": mod, "class": cls}
        path = index.path_of(mod)
        hit = index.resolve(path, cls) if path else None
        if table.startswith("_TRANSFORMERS") or hit is None or hit[1] is None:
            why = ("Transformers modelling backend: layers are built from the HF model at run time"
                   if table.startswith("_TRANSFORMERS") else f"{mod}.{cls} not found in the source")
            rec.update(defined_in=None, markers=None, call_sites=[], config_fields={}, why=why)
        else:
            rec.update(defined_in=f"{hit[0]}:{hit[1]}", **walk(index, *hit))
        archs[arch] = rec
    return {"vllm_version": vllm_version(root), "tables": list(TABLES), "markers": MARKERS, "architectures": archs,
            "previously_supported": previously_supported(root)}


def _provenance(version: str, argv: list[str]) -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = "unknown"
    return {"device": "none (source read with ast)", "date": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
            "commit": commit or "unknown", "command": "python parity/gen_arch_consumers.py" + "".join(f" {a}" for a in argv),
            "vllm": version, "torch": "not used"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm-root", type=Path, default=None, help="the vllm package directory (default: this interpreter's)")
    ap.add_argument("--check", action="store_true", help="exit 1 if the committed table differs from a fresh one")
    args = ap.parse_args(argv)
    root = args.vllm_root or default_vllm_root()
    if not (root / "model_executor/models/registry.py").is_file():
        print(f"no vLLM source at {root} (no model_executor/models/registry.py)", file=sys.stderr)
        return 2
    payload = generate(root)
    out = out_path(payload["vllm_version"])
    if args.check:
        old = json.loads(out.read_text(encoding="utf-8")) if out.is_file() else {}
        same = all(old.get(k) == payload[k] for k in payload)
        print(f"{out.name} up to date" if same else f"{out.name} differs from vLLM's source: re-run without --check")
        return 0 if same else 1
    out.write_text(json.dumps({"provenance": _provenance(payload["vllm_version"], [a for a in argv if a != "--check"]),
                               **payload}, indent=1) + "\n", encoding="utf-8")
    print(f"{out.relative_to(ROOT)}: {len(payload['architectures'])} architectures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
