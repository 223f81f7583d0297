"""The ``vllm serve`` command line, parsed as the run's vLLM release parses it, from flags generated out of vLLM itself.

The flags are data: ``vllm_0_33_flags.json``, written by ``parity/gen_vllm_flags.py``
from vLLM's own ``vllm serve`` parser and checked by ``parity/test_vllm_flags_parity.py``.
:func:`parse_serve_args` builds an ``argparse`` parser from that table (booleans
as ``BooleanOptionalAction``/vLLM's ``EnableDisableAction``, vLLM's value types)
and rewrites argv as vLLM's ``FlexibleArgumentParser.parse_args``
(``vllm/utils/argparse_utils.py``) does: ``--max_num_seqs`` = ``--max-num-seqs``,
``-O3``/``-O 3``/``-O=3`` = ``--optimization-level 3``, dotted JSON keys
(``-cc.cudagraph_capture_sizes '[1,2]'``, ``--x.key+ a,b``), ``--config FILE.yaml``.
Like vLLM's parser (Python's ``allow_abbrev``), a unique prefix of a flag is that
flag (``--max-num-seq 4`` *is* ``--max-num-seqs 4`` in vLLM 0.33; a note says so);
an unknown flag is an error naming the closest real ones (``difflib``).
"""

from __future__ import annotations

import argparse
import difflib
import functools
import json
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tqlab.core import vllm_versions

__all__ = ["ENV_KEY", "ENV_SIZES", "FLAGS_FILE", "VllmArgsError", "env_flag", "human_readable_int", "human_readable_int_or_auto", "lax_int",
           "parse_serve_args", "split_serve_line", "vllm_flags"]

FLAGS_FILE = vllm_versions.get(vllm_versions.DEFAULT).flags_file  # the default release's; vllm_flags() reads the run's


class VllmArgsError(ValueError):
    """A ``vllm serve`` line that vLLM would refuse (or tqlab cannot read); one line, naming the flag."""


# --------------------------------------------------------------------------- #
# vLLM's value parsers (vllm/utils/argparse_utils.py)                         #
# --------------------------------------------------------------------------- #

_HR = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_DEC = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BIN = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def human_readable_int(value: str) -> int:
    """vLLM's ``human_readable_int``: ``'128k'`` -> 128,000, ``'1K'`` -> 1,024, ``'25.6k'`` -> 25,600.

    Decimal suffixes k/m/g/t (x1000^n) take decimals, binary K/M/G/T (x1024^n)
    do not; otherwise Python's ``int()`` (so ``' 12 '``, ``'1_000'`` pass and
    ``'infk'``, ``'1e30k'``, ``'1e3'``, ``'0x10'`` raise ``ValueError``).
    """
    value = value.strip()
    m = _HR.fullmatch(value)
    if m:
        number, suffix = m.groups()
        if suffix in _DEC:
            return int(float(number) * _DEC[suffix])
        try:
            return int(number) * _BIN[suffix]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"Decimals are not allowed with binary suffixes like {suffix}. "
                f"Did you mean to use {number}{suffix.lower()} instead?") from None
    return int(value)


def human_readable_int_or_auto(value: str) -> int:
    """vLLM's ``human_readable_int_or_auto``: ``'auto'`` or ``'-1'`` -> -1, else :func:`human_readable_int`."""
    value = value.strip()
    if value == "-1" or value.lower() == "auto":
        return -1
    return human_readable_int(value)


def lax_int(value: Any, where: str) -> int:
    """An integer as vLLM 0.33's config classes take one: pydantic's lax mode (vLLM's configs are pydantic dataclasses).

    ``3``, ``3.0``, ``"3"``, ``" 3 "``, ``"+3"``, ``"1_000"``, ``"3.0"`` and ``True`` (1) are integers;
    ``2.5``, ``"3.5"``, ``"x"``, ``"1k"``, ``"1e3"``, ``"0x10"``, ``""``, ``inf``, ``None`` and lists are not
    (``pydantic`` ``int`` in lax mode: what ``CompilationConfig(cudagraph_capture_sizes=["1", "2.0"])``
    does; checked against pydantic in ``parity/test_config_readers_parity.py``). Range checks are the
    caller's. Raises :class:`VllmArgsError` naming ``where`` (the flag and key) and the value.
    """
    v = value
    if isinstance(v, str):
        t = v.strip()
        if re.fullmatch(r"[+-]?[0-9]+(?:_[0-9]+)*", t):
            return int(t)
        m = re.fullmatch(r"([+-]?[0-9]+(?:_[0-9]+)*)\.0*", t)
        if m:
            return int(m.group(1))
        raise VllmArgsError(f"{where} must be an integer, got {value!r}")
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, float) and math.isfinite(v) and v.is_integer() and abs(v) < 2**63:
        return int(v)
    raise VllmArgsError(f"{where} must be an integer, got {value!r}")


def _json_value(value: str) -> Any:
    """A JSON flag value; bare ``80m``-style numbers expanded as vLLM's ``_expand_json_human_readable_numbers``."""
    parts = re.split(r'("(?:[^"\\]|\\.)*")', value)
    for i in range(0, len(parts), 2):
        parts[i] = re.sub(r"\b\d+(?:\.\d+)?[kKmMgGtT]\b", lambda m: str(human_readable_int(m.group())), parts[i])
    return json.loads("".join(parts))


def _json_object(value: str) -> Any:
    try:
        v = _json_value(value)
    except (json.JSONDecodeError, argparse.ArgumentTypeError, ValueError) as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e}): {_short(value)}") from None
    except RecursionError:
        raise argparse.ArgumentTypeError(f"JSON nested too deeply to read: {_short(value)}") from None
    if not isinstance(v, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object such as '{{\"key\": 1}}', got {value!r}")
    return v


def _json_or_str(value: str) -> Any:
    return _json_object(value) if re.match(r"(?s)^\s*{.*}\s*$", value) else value


def _optional(fn):
    """vLLM's ``optional_type``: ``''`` or ``'None'`` -> None, else ``fn``; named after ``fn`` for argparse's messages."""
    def parse(value: str) -> Any:
        return None if value in ("", "None") else fn(value)
    parse.__name__ = getattr(fn, "__name__", "value")
    return parse


_TYPES = {
    "int": int, "float": float, "str": str, "human_readable_int": human_readable_int,
    "human_readable_int_or_auto": human_readable_int_or_auto, "json": _json_object, "json_or_str": _json_or_str,
}


# --------------------------------------------------------------------------- #
# The parser, from the generated flag table                                   #
# --------------------------------------------------------------------------- #


def vllm_flags(vllm: "str | None" = None) -> dict[str, Any]:
    """The generated table of ``vllm serve`` flags of release ``vllm`` (None: the run's,
    :func:`tqlab.core.vllm_versions.current`; the file is its ``flags_file``, ``vllm_<v>_flags.json``):
    ``{"vllm_version", "flags": [...]}``."""
    return _flag_table(vllm_versions.get(vllm).name)


@functools.lru_cache(maxsize=None)
def _flag_table(name: str) -> dict[str, Any]:
    path = vllm_versions.get(name).flags_file
    table = json.loads(path.read_text())
    if not isinstance(table, dict) or not isinstance(table.get("flags"), list):
        raise RuntimeError(f"{path}: not a flag table; regenerate it with parity/gen_vllm_flags.py")
    return table


class _BoolAction(argparse.Action):
    """``BooleanOptionalAction`` / vLLM's ``EnableDisableAction``: the negative spellings store False."""

    def __init__(self, option_strings, dest, negative=(), **kw):
        self.negative = frozenset(negative)
        super().__init__(option_strings, dest, nargs=0, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, option_string not in self.negative)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print usage and exit(2)
        raise VllmArgsError(f"vllm serve: {message}")


def _serve_parser() -> _Parser:
    """``vllm serve``'s parser for the run's release."""
    return _serve_parser_for(vllm_versions.current().name)


@functools.lru_cache(maxsize=None)
def _serve_parser_for(name: str) -> _Parser:
    table = vllm_flags(name)
    p = _Parser(prog="vllm serve", add_help=False, allow_abbrev=table.get("allow_abbrev", True),
                argument_default=argparse.SUPPRESS, exit_on_error=False)
    p.add_argument("model_tag", nargs="?")
    for f in table["flags"]:
        if f["kind"] == "bool_flag":
            p.add_argument(*f["options"], dest=f["dest"], action="store_true")
        elif f["kind"] == "bool_optional":
            p.add_argument(*f["options"], dest=f["dest"], action=_BoolAction, negative=f["negative_options"])
        else:
            typ = _TYPES.get(f["type"], str)
            kw: dict[str, Any] = {"dest": f["dest"], "type": _optional(typ) if f["optional"] else typ}
            if f["nargs"] is not None:
                kw["nargs"] = f["nargs"]
            if f["const"] is not None:
                kw["const"] = f["const"]
            if f["choices"]:
                kw["choices"] = [c for c in f["choices"] if c is not None]
            p.add_argument(*f["options"], **kw)
    return p


def _option_strings() -> tuple[str, ...]:
    return _option_strings_for(vllm_versions.current().name)


@functools.lru_cache(maxsize=None)
def _option_strings_for(name: str) -> tuple[str, ...]:
    return tuple(sorted(o for f in vllm_flags(name)["flags"] for o in f["options"]))


def _preprocess(argv: list[str]) -> list[str]:
    """vLLM's ``FlexibleArgumentParser.parse_args`` rewriting: dashes, ``-O``, dotted JSON keys."""
    out: list[str] = []
    for i, a in enumerate(argv):
        if a.startswith("--"):
            key, eq, val = a.partition("=")
            head, dot, tail = key[2:].partition(".")
            out.append("--" + head.replace("_", "-") + dot + tail + eq + val)
        elif a.startswith("-O") and a != "-O":
            out += ["--optimization-level", a[3:] if a[2] == "=" else a[2:]]
        elif a == "-O" and i + 1 < len(argv) and argv[i + 1] in {"0", "1", "2", "3"}:
            out.append("--optimization-level")
        else:
            out.append(a)
    dicts: dict[str, dict[str, Any]] = {}
    keep: list[str] = []
    skip = False
    for i, a in enumerate(out):
        if skip:
            skip = False
            continue
        if a.startswith("-") and "." in a.partition("=")[0]:
            key, eq, val = a.partition("=")
            if not eq:
                if i + 1 >= len(out):
                    raise VllmArgsError(f"vllm serve: argument {key}: expected one argument")
                val, skip = out[i + 1], True
            if key.endswith("+"):
                key, val = key[:-1], json.dumps(val.split(","))
            name, *keys = key.split(".")
            try:
                value: Any = json.loads(val)
            except RecursionError:
                raise VllmArgsError(f"vllm serve: argument {key}: JSON nested too deeply to read: {_short(val)}") from None
            except json.JSONDecodeError:
                try:
                    value = human_readable_int(val)
                except (ValueError, argparse.ArgumentTypeError):
                    value = val
            d = dicts.setdefault(name, {})
            for k in keys[:-1]:
                d = d.setdefault(k, {}) if isinstance(d.get(k), dict) or k not in d else d
            last = keys[-1] if keys else ""
            d[last] = d[last] + value if isinstance(d.get(last), list) and isinstance(value, list) else value
            continue
        keep.append(a)
    for name, d in dicts.items():
        keep += [name, json.dumps(d)]
    return keep


def _pull_config_file(argv: list[str], notes: list[str]) -> list[str]:
    """``--config FILE.yaml``: its flags go right after the model, so the line wins
    (``FlexibleArgumentParser._pull_args_from_config`` / ``load_config_file``). A ``false``
    boolean is dropped: ``vllm``'s root parser, which expands the file, knows no ``--no-`` flag."""
    if "--config" not in argv:
        return argv
    if argv.count("--config") > 1:
        raise VllmArgsError("vllm serve: more than one --config file")
    i = argv.index("--config")
    if i == len(argv) - 1:
        raise VllmArgsError("vllm serve: --config needs a YAML file")
    path = argv[i + 1]
    if path.split(".")[-1] not in ("yaml", "yml"):
        raise VllmArgsError(f"vllm serve: --config {path}: must be a .yaml/.yml file, as vLLM requires")
    try:
        import yaml
    except ImportError:
        raise VllmArgsError(f"--config {path}: reading it needs PyYAML (pip install pyyaml)") from None
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except RecursionError:
        raise VllmArgsError(f"--config {path}: nested too deeply to read") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise VllmArgsError(f"--config {path}: cannot be read ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    if not isinstance(data, dict):
        raise VllmArgsError(f"--config {path}: the top level must be a mapping of flag: value, got {_short(data)}")
    flags: list[str] = []
    for key, value in data.items():
        if isinstance(value, bool):
            flags += [f"--{key}"] if value else []
            if not value:
                notes.append(f"{key}: false in {path} has no effect in vLLM 0.33 (the root `vllm` parser that reads "
                             f"--config knows no --no-{key}); the default stays")
        elif isinstance(value, list):
            flags += [f"--{key}", *map(str, value)] if value else []
        else:
            flags += [f"--{key}", json.dumps(value) if isinstance(value, dict) else str(value)]
    rest = argv[:i] + argv[i + 2:]
    cut = 1 if rest and not rest[0].startswith("-") else 0
    return rest[:cut] + flags + rest[cut:]


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _strip_launcher(argv: list[str]) -> list[str]:
    for prefix in (["vllm", "serve"], ["python", "-m", "vllm.entrypoints.openai.api_server"],
                   ["python3", "-m", "vllm.entrypoints.openai.api_server"], ["serve"]):
        if argv[: len(prefix)] == prefix:
            return argv[len(prefix):]
    return argv


ENV_KEY = "env"
"""Key of :func:`parse_serve_args`'s result holding the line's leading ``NAME=value`` words (only when there are some)."""
_ENV_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.S)
ENV_APPLIED = {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "lets --max-model-len exceed the derived length (vllm/envs.py; "
                                               "vllm/config/model.py _get_and_verify_max_len)",
               "VLLM_BATCH_INVARIANT": "batch-invariant mode: backends without it are refused at start-up "
                                       "(AttentionBackend.validate_configuration: TURBOQUANT, FLASHINFER, ...)"}
"""Boolean environment variables that change what tqlab computes, with what they do in vLLM 0.33."""
ENV_SIZES = {"VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE": (
    "flashinfer_workspace_buffer_size", "the MLA prefill workspace request of FlashInfer / TRT-LLM ragged "
    "(mla/prefill/flashinfer.py, trtllm_ragged.py: ((VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE,), uint8)), in bytes")}
"""Integer environment variables of ``vllm/envs.py`` that size a workspace consumer: ``{name: (EngineConfig field,
what it sizes)}``. Every other variable of ``envs.py`` read next to a workspace call was checked: see ``_ENV_NOTED``."""
_ENV_NOTED = {
    "CUDA_VISIBLE_DEVICES": "which GPUs the process sees; the workspace per rank follows --tensor-parallel-size, "
                            "not this list",
    "VLLM_SPARSE_INDEXER_MAX_LOGITS_MB": "sizes a torch.empty of the sparse indexer's profile run, not a workspace "
                                         "request: no effect on the workspace",
    "VLLM_DEBUG_WORKSPACE": "[WORKSPACE DEBUG] logs only: no effect on the workspace",
    "VLLM_DEEP_GEMM_WARMUP": "decides deep_gemm_warmup.py:_warmup's workspace requests, a consumer tqlab does not size",
    "VLLM_MARLIN_INPUT_DTYPE": "Marlin's persistent workspace (marlin_utils.py), which tqlab does not size",
    "VLLM_GDN_DECODE_KERNEL": "Qwen GDN's warm-up workspace (qwen_gdn_linear_attn.py), which tqlab does not size",
    "VLLM_USE_DEEP_GEMM": "decides deep_gemm_warmup.py:_warmup and the MoE experts class, which tqlab does not size",
    "VLLM_MOE_USE_DEEP_GEMM": "decides deep_gemm_warmup.py:_warmup and the MoE experts class, which tqlab does not size",
}
_ENV_UNKNOWN = ("not read by tqlab: no workspace call tqlab models reads it, but vLLM may read it elsewhere "
                "(vllm/envs.py); tqlab cannot say it has no effect")


def env_flag(env: dict[str, str] | None, name: str) -> bool:
    """A boolean vLLM environment variable as ``vllm/envs.py`` reads it (``"1"``/``"true"``, any case, stripped).

    ``env``: the serve line's ``NAME=value`` words (:data:`ENV_KEY`); where the line does not set
    ``name``, this process's environment decides (a shell's prefix overrides its environment).
    """
    import os

    value = (env or {}).get(name, os.environ.get(name, "0"))
    return value.strip().lower() in ("1", "true")


_PROMPTS = ("$", "#", "%", ">")
"""Shell prompts a pasted command line may start with (bash/sh ``$``, root ``#``, zsh ``%``, PowerShell/cmd ``>``)."""
_LAUNCHER_WORDS = {"vllm", "serve", "python", "python3", "-m", "vllm.entrypoints.openai.api_server"}


def split_serve_line(line: str) -> tuple[list[str], dict[str, str], list[str]]:
    """A pasted shell command -> ``(argv, environment words, notes)``, as a POSIX shell splits it.

    A backslash at the end of a line continues it (``vllm serve M \\`` newline ``--max-model-len 8k``);
    a leading shell prompt word (``$``, ``#``, ``%``, ``>``) is dropped with a note;
    leading ``NAME=value`` words (and a leading ``env``) are the command's environment:
    :data:`ENV_APPLIED` ones change the result, the others are noted. Raises :class:`VllmArgsError`
    for unbalanced quotes.
    """
    text = re.sub(r"\\\r?\n", " ", line)
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise VllmArgsError(f"vllm serve line: {e} (shell quoting)") from None
    env: dict[str, str] = {}
    notes: list[str] = []
    if words[:1] and words[0] in _PROMPTS:  # a pasted "$ vllm serve ..." keeps the shell's prompt
        notes.append(f"leading shell prompt {words.pop(0)!r} dropped")
    if words[:1] == ["env"]:
        words = words[1:]
    while words and _ENV_WORD.fullmatch(words[0]) and not words[0].startswith("-"):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
        if name in ENV_SIZES:
            notes.append(f"environment {name}={value}: applied ({ENV_SIZES[name][1]}; it changes the lock only "
                         "where that consumer runs: see the consumer table)")
        elif name in ENV_APPLIED and env_flag(env, name):
            notes.append(f"environment {name}={value}: applied ({ENV_APPLIED[name]})")
        elif name in ENV_APPLIED:
            notes.append(f"environment {name}={value}: off (vllm/envs.py reads only 1 or true, any case, as on)")
        else:
            why = _ENV_NOTED.get(name, _ENV_UNKNOWN if name.startswith("VLLM_") else
                                 "not read by tqlab; no effect on the workspace in tqlab's model")
            notes.append(f"environment {name}={value}: {why}")
    return words, env, notes


def _unknown_flag_error(extra: list[str]) -> VllmArgsError:
    for tok in extra:
        if tok.startswith("-") and not re.fullmatch(r"-\d+(\.\d+)?", tok):
            name = tok.partition("=")[0]
            close = difflib.get_close_matches(name, _option_strings(), n=3, cutoff=0.6)
            hint = f"; did you mean {' or '.join(close)}?" if close else ""
            return VllmArgsError(f"vllm serve: unknown flag {name} (not a vLLM {vllm_flags()['vllm_version']} flag){hint}")
    if _LAUNCHER_WORDS & set(extra):  # e.g. "sudo vllm serve M": the word before the launcher was read as the model
        return VllmArgsError(f"vllm serve: unrecognized arguments: {' '.join(extra)} (the line must start with "
                             "'vllm serve' or the model; remove what comes before the launcher)")
    return VllmArgsError(f"vllm serve: unrecognized arguments: {' '.join(extra)} (a boolean flag such as "
                         "--enable-chunked-prefill takes no value; use its --no-/--disable- form)")


def parse_serve_args(engine_args: str | Sequence[str] | None) -> tuple[dict[str, Any], list[str]]:
    """Parse a ``vllm serve`` line like vLLM -> ``({dest: value} of the flags given, notes)``.

    ``engine_args``: a shell-quoted string (multi-line with ``\\`` continuations, leading
    ``NAME=value`` environment words: :func:`split_serve_line`; they come back under
    :data:`ENV_KEY`) or argv; a leading ``vllm serve`` /
    ``python -m vllm.entrypoints.openai.api_server`` is dropped; the model is
    ``model_tag``; ``--config FILE.yaml`` is expanded as vLLM does. Values are converted with vLLM's own types (JSON configs
    are dicts). Raises :class:`VllmArgsError` (one line) for an unknown flag
    (naming the closest), an ambiguous prefix, a bad value, or an extra word.
    """
    if engine_args is None:
        return {}, []
    env: dict[str, str] = {}
    notes: list[str] = []
    if isinstance(engine_args, str):
        argv, env, notes = split_serve_line(engine_args)
    else:
        argv = [str(a) for a in engine_args]
    argv = _preprocess(_pull_config_file(_strip_launcher(argv), notes))
    parser = _serve_parser()
    try:
        ns, extra = parser.parse_known_args(argv)
    except argparse.ArgumentError as e:
        raise VllmArgsError(f"vllm serve: {e}") from None
    if extra:
        raise _unknown_flag_error(extra)
    if str(getattr(ns, "model_tag", "")).lower() in ("true", "false"):
        notes.append(f"model {ns.model_tag!r}: vLLM reads a word after a boolean flag as the model name (booleans take no value)")
    opts = set(_option_strings())
    for a in argv:
        name = a.partition("=")[0]
        if name.startswith("--") and name not in opts and "." not in name:
            full = [o for o in opts if o.startswith(name)]
            if len(full) == 1:
                notes.append(f"{name} read as {full[0]}: vLLM's parser accepts unique prefixes (argparse allow_abbrev)")
    given = vars(ns)
    _check_config_keys(given)
    if env:
        given[ENV_KEY] = env
    return given, notes


_CONFIG_CLASSES = {"attention_config": "AttentionConfig", "compilation_config": "CompilationConfig",
                   "speculative_config": "SpeculativeConfig"}


def _check_config_keys(given: Mapping[str, Any]) -> None:
    """Raise :class:`VllmArgsError` naming the first key of a JSON config flag (``-cc``, ``--attention-config`` and its
    dotted keys, ``--speculative-config``) that its config class does not take, or a ``method`` outside
    ``SpeculativeConfig.method``'s ``Literal``: ``EngineArgs`` builds ``CompilationConfig(**d)`` (and the others),
    which pydantic refuses ("Unexpected keyword argument", ``literal_error``). The field lists are the generated
    table's ``config_keys`` / ``speculative_methods`` (``parity/gen_vllm_flags.py``); a table without them checks
    nothing."""
    table = vllm_flags()
    for dest, cls in _CONFIG_CLASSES.items():
        value, known = given.get(dest), table.get("config_keys", {}).get(dest)
        if not isinstance(value, dict) or known is None:
            continue
        flag = "--" + dest.replace("_", "-")
        for key in value:
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=1)
                raise VllmArgsError(f"vllm serve: {flag}: {key!r} is not a field of {cls} (vLLM {table['vllm_version']}: "
                                    f"Unexpected keyword argument){f'; did you mean {close[0]!r}?' if close else ''}")
    methods, spec = table.get("speculative_methods"), given.get("speculative_config")
    if methods and isinstance(spec, dict) and spec.get("method") is not None and spec["method"] not in methods:
        raise VllmArgsError(f"vllm serve: --speculative-config: method {_short(spec['method'])} is not one of vLLM "
                            f"{table['vllm_version']}'s: {', '.join(methods)}")
