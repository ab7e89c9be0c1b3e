"""A command's options declared once, as the fields of a dataclass, and turned into its argparse
parser here: the one place outside config/parse.py (which does the same for the training stages
through HfArgumentParser) that calls `add_argument`.

    @dataclass
    class GenerateOptions:
        checkpoint: str = argument(None, "a checkpoint folder", positional=True)
        max_new_tokens: int | None = argument(None, like=(GenerationArgs, "max_new_tokens"))

    options = parse_options(GenerateOptions, argv, prog="hydrappo generate", description="...")

A field's type gives argparse its `type` (`int | None` -> int; int, float and Path convert), a `Literal[...]` its choices and a
`bool` a switch (`store_true`); `like=(Section, "field")` takes the help text and the Range of a
config option (config/values.py), so that `generate --max_new_tokens 0` is refused by the rule
`generation.max_new_tokens` declares, in the same words. parse_options checks every Range after
parsing and reports every value outside one at once (a ConfigError: exit code 2)."""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..usercode import CommandParser
from .problems import Problems
from .values import Range

_UNSET = object()


@dataclass(frozen=True)
class _Spelling:
    """How a field is written on the command line, beyond what its type says."""

    names: tuple[str, ...] = ()  # more spellings (e.g. "-N", "--overwrite_output_dir")
    positional: bool = False
    type: Any = None  # a converter of its own (argparse's `type`), instead of the field's type
    choices: tuple | None = None
    nargs: str | int | None = None
    metavar: str | None = None
    required: bool = False
    exclusive: str | None = None  # fields with the same word here may not be given together
    repeat: bool = False  # the option may be given several times: its values are collected in a list


def argument(
    default=None,
    help: str | None = None,
    *,
    like: tuple[type, str] | None = None,
    range: Range | None = None,
    names: tuple[str, ...] = (),
    positional: bool = False,
    type=None,
    choices=None,
    nargs=None,
    metavar: str | None = None,
    required: bool = False,
    exclusive: str | None = None,
    repeat: bool = False,
):
    """A command's option as a dataclass field. `like=(Section, "name")`: the help and the Range of
    that config option (its default is not taken: a command's None means "what the run used")."""
    if like is not None:
        declared = {f.name: f for f in dataclasses.fields(like[0])}[like[1]]
        help = help or declared.metadata.get("help", "") + (" Default: the run's own." if default is None else "")
        range = range or declared.metadata.get("range")
    metadata = {
        "help": help,
        "command_line": _Spelling(
            tuple(names),
            positional,
            type,
            tuple(choices) if choices else None,
            nargs,
            metavar,
            required,
            exclusive,
            repeat,
        ),
    }
    if range is not None:
        metadata["range"] = range
    return field(default=default, metadata=metadata)


def _plain_type(annotation):
    """`int | None` -> int; `list[float] | None` -> (list, float); `Literal[...]` -> the Literal."""
    arguments = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return _plain_type(arguments[0])
    if typing.get_origin(annotation) is list:
        return (list, arguments[0] if arguments else str)
    return annotation


def add_options(parser: argparse.ArgumentParser, options: type, dashes: bool = False) -> argparse.ArgumentParser:
    """`options`' fields as `parser`'s arguments (`--name`, or `--na-me` with `dashes`); returns `parser`."""
    hints = typing.get_type_hints(options)
    groups: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for declared in dataclasses.fields(options):
        spelling: _Spelling = declared.metadata.get("command_line", _Spelling())
        kind = _plain_type(hints[declared.name])
        keywords: dict[str, Any] = {"help": declared.metadata.get("help")}
        if kind is bool:
            keywords["action"] = "store_true"
        else:
            keywords["default"] = declared.default
            element = kind[1] if isinstance(kind, tuple) else kind
            if typing.get_origin(element) is Literal:
                keywords["choices"] = typing.get_args(element)
            elif spelling.type is not None or element in (int, float, Path):
                keywords["type"] = spelling.type or element
            if isinstance(kind, tuple) and not spelling.repeat:
                keywords["nargs"] = "+"
        if spelling.repeat:
            keywords["action"] = "append"
        for key in ("choices", "nargs", "metavar"):
            if getattr(spelling, key) is not None:
                keywords[key] = getattr(spelling, key)
        if spelling.positional:
            if spelling.nargs is None:  # argparse: a required positional takes no default
                keywords.pop("default", None)
            names = (declared.name,)
        else:
            flag = "--" + (declared.name.replace("_", "-") if dashes else declared.name)
            names = (*[n for n in spelling.names if n.startswith("-") and len(n) == 2], flag)
            names += tuple(n for n in spelling.names if n not in names)
            keywords["dest"] = declared.name
            if spelling.required:
                keywords["required"] = True
        target = parser
        if spelling.exclusive is not None:
            if spelling.exclusive not in groups:
                groups[spelling.exclusive] = parser.add_mutually_exclusive_group()
            target = groups[spelling.exclusive]
        target.add_argument(*names, **keywords)
    return parser


def command_parser(options: type, prog: str, description: str, dashes: bool = False, **parser_keywords):
    """hydrappo's parser (usercode.CommandParser: its exits end the command alone) for `options`."""
    return add_options(CommandParser(prog=prog, description=description, **parser_keywords), options, dashes)


def options_from(options: type, namespace: argparse.Namespace, dashes: bool = False):
    """The dataclass of a parsed command line; every value outside its option's Range at once (ConfigError)."""
    values = options(**{f.name: getattr(namespace, f.name) for f in dataclasses.fields(options)})
    check_ranges(values, dashes)
    return values


def check_ranges(values, dashes: bool = False) -> None:
    """A ConfigError naming every option of `values` (a dataclass of this module's fields) outside its Range."""
    range_problems(values, dashes).raise_if_any("the command line")


def range_problems(values, dashes: bool = False) -> Problems:
    """The options of `values` outside their Range, one problem each (a None value is "the run's own": unchecked)."""
    problems = Problems()
    for declared in dataclasses.fields(values):
        rule: Range | None = declared.metadata.get("range")
        value = getattr(values, declared.name)
        flag = "--" + (declared.name.replace("_", "-") if dashes else declared.name)
        for one in value if isinstance(value, list) else [value]:
            if rule is not None and one is not None and not isinstance(one, bool) and not rule.holds(one):
                problems.add(flag, one, rule.describe(one), rule.fix or f"leave {flag} out for the run's own value")
                break
    return problems


def parse_options(options: type, argv: list[str], prog: str, description: str, dashes: bool = False, **keywords):
    """`argv` read into an `options` dataclass (argparse's errors and --help end the command as usual)."""
    parser = command_parser(options, prog, description, dashes, **keywords)
    return options_from(options, parser.parse_args(argv), dashes)
