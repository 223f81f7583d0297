"""Generate ``tqlab/vllm/vllm_<version>_flags.json``: the flags of ``vllm serve``, read from vLLM's own parser.

Run in a parity environment (CPU is enough); the file is named by the installed release
(``vllm_0_33_flags.json`` under vLLM 0.33.0, ``vllm_0_34_flags.json`` under 0.34.0)::

    .venv-parity/bin/python parity/gen_vllm_flags.py            # rewrite the file
    .venv-parity/bin/python parity/gen_vllm_flags.py --check    # exit 1 if it differs

The parser is built the way ``vllm serve`` builds it
(``vllm/entrypoints/cli/main.py`` ``main``: a root ``FlexibleArgumentParser``
with subparsers; ``vllm/entrypoints/cli/serve.py``
``ServeSubcommand.subparser_init`` -> ``vllm/entrypoints/common/cli_args.py``
``make_arg_parser`` = serve's own flags + ``FrontendArgs.add_cli_args`` +
``AsyncEngineArgs.add_cli_args``). Each argparse action becomes one record:
``dest``, ``options`` (every option string, aliases such as ``-tp`` included),
``negative_options`` (``--no-x`` / ``--disable-x`` of a boolean),
``kind`` (``bool_flag`` = store_true/store_false, ``bool_optional`` =
``BooleanOptionalAction``/vLLM's ``EnableDisableAction``, ``value``),
``type`` (``int``, ``human_readable_int``, ``human_readable_int_or_auto``,
``float``, ``str``, ``json`` for ``parse_type(json.loads)`` and dataclass
configs, ``json_or_str``), ``optional`` (``None`` accepted), ``nargs``,
``const``, ``choices``, ``default`` (JSON-able ones only), ``engine`` (True
when ``EngineArgs.add_cli_args`` adds it) and ``group``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tqlab" / "vllm" / "vllm_0_33_flags.json"


def _type_name(fn) -> tuple[str, bool]:
    """``(type name, optional)`` of an argparse ``type`` callable made by vLLM's ``_compute_kwargs``."""
    if fn is None:
        return "str", False
    optional = False
    name = getattr(fn, "__name__", repr(fn))
    while name in ("_optional_type", "_parse_type"):
        optional = optional or name == "_optional_type"
        cells = [c.cell_contents for c in (fn.__closure__ or ())]
        fn = next(c for c in cells if callable(c))
        name = getattr(fn, "__name__", repr(fn))
    if name == "parse_dataclass" or name == "loads":
        return "json", optional
    if name == "union_dict_and_str":
        return "json_or_str", optional
    if name in ("int", "float", "str", "human_readable_int", "human_readable_int_or_auto"):
        return name, optional
    return name, optional


def _jsonable(v):
    try:
        json.dumps(v)
        return v
    except TypeError:
        return None


def _record(action: argparse.Action, engine_dests: set[str], group: str) -> dict:
    from vllm.utils.argparse_utils import EnableDisableAction

    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        kind = "bool_flag"
    elif isinstance(action, argparse.BooleanOptionalAction):
        kind = "bool_optional"
    else:
        kind = "value"
    options = sorted(action.option_strings)
    negative: list[str] = []
    if isinstance(action, EnableDisableAction):
        negative = sorted(action.negative_option_strings)
        options = sorted(set(options) | set(negative))
    elif kind == "bool_optional":
        negative = sorted(o for o in options if o.startswith("--no-"))
    typ, optional = ("bool", False) if kind != "value" else _type_name(action.type)
    choices = None if action.choices is None else [_jsonable(c) for c in action.choices]
    return {
        "dest": action.dest,
        "options": options,
        "negative_options": negative,
        "kind": kind,
        "type": typ,
        "optional": optional,
        "nargs": action.nargs,
        "const": _jsonable(action.const),
        "choices": choices,
        "default": _jsonable(action.default),
        "engine": action.dest in engine_dests,
        "group": group,
    }


def generate() -> dict:
    """The flag table of this vLLM's ``vllm serve`` (see the module docstring)."""
    import vllm
    from vllm import platforms

    if platforms.current_platform.is_unspecified():  # as vllm/entrypoints/cli/main.py main() does
        from vllm.platforms.cpu import CpuPlatform

        platforms.current_platform = CpuPlatform()
    from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    root = FlexibleArgumentParser(description="vLLM CLI")
    sub = root.add_subparsers(required=False, dest="subparser")
    serve = ServeSubcommand().subparser_init(sub)
    engine_dests = {a.dest for a in EngineArgs.add_cli_args(FlexibleArgumentParser())._actions}
    async_dests = {a.dest for a in AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())._actions}
    groups = {id(a): (g.title or "") for g in serve._action_groups for a in g._group_actions}
    flags = [
        _record(a, engine_dests | async_dests, groups.get(id(a), ""))
        for a in serve._actions
        if a.option_strings and not isinstance(a, argparse._HelpAction)
    ]
    flags.sort(key=lambda r: r["dest"])
    return {
        "vllm_version": vllm.__version__,
        "generated_by": "parity/gen_vllm_flags.py",
        "source": "vllm/entrypoints/common/cli_args.py make_arg_parser (vllm serve) + "
                  "vllm/engine/arg_utils.py EngineArgs.add_cli_args",
        "allow_abbrev": serve.allow_abbrev,
        "flags": flags,
        **_config_keys(),
    }


def _config_keys() -> dict:
    """``config_keys``: per JSON flag, the keyword arguments its config class accepts (``EngineArgs`` builds
    ``CompilationConfig(**d)``, ``AttentionConfig(**d)``, ``SpeculativeConfig(**d)``: pydantic refuses any other
    key, "Unexpected keyword argument"); ``speculative_methods``: ``SpeculativeConfig.method``'s ``Literal``."""
    import dataclasses
    import typing

    from vllm.config import AttentionConfig, CompilationConfig, SpeculativeConfig

    def keys(cls) -> list[str]:  # init fields and InitVars (a pydantic dataclass's __init__ takes **kwargs)
        return sorted(n for n, f in cls.__dataclass_fields__.items()
                      if f.init and f._field_type is not dataclasses._FIELD_CLASSVAR)

    method = typing.get_type_hints(SpeculativeConfig)["method"]
    literal = next(a for a in typing.get_args(method) if typing.get_origin(a) is typing.Literal)
    return {"config_keys": {"attention_config": keys(AttentionConfig), "compilation_config": keys(CompilationConfig),
                            "speculative_config": keys(SpeculativeConfig)},
            "speculative_methods": list(typing.get_args(literal))}


def render(table: dict) -> str:
    return json.dumps(table, indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="compare with the checked-in file instead of writing it")
    p.add_argument("--out", type=Path, default=None, help="default: tqlab/vllm/vllm_<major>_<minor>_flags.json")
    a = p.parse_args(argv)
    text = render(generate())
    if a.out is None:
        major_minor = "_".join(json.loads(text)["vllm_version"].split(".")[:2])
        a.out = OUT.with_name(f"vllm_{major_minor}_flags.json")
    if a.check:
        same = a.out.is_file() and a.out.read_text() == text
        print(f"{a.out}: {'up to date' if same else 'DIFFERS from vLLM ' + json.loads(text)['vllm_version']}")
        return 0 if same else 1
    a.out.write_text(text)
    print(f"wrote {a.out} ({len(json.loads(text)['flags'])} flags)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
