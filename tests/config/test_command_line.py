"""A command's options declared as dataclass fields (config/command_line.py): the parser argparse
gets from them, and the Ranges checked after parsing, in the config's own words."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pytest

from hydrappo.config import ConfigError, GenerationArgs
from hydrappo.config.command_line import argument, parse_options
from hydrappo.config.values import Range
from hydrappo.usercode import ParserExit


@dataclass
class Toy:
    source: str | None = argument(None, "what to read", positional=True)
    steps: int = argument(3, "how many", range=Range(1))
    rate: float | None = argument(None, "how fast")
    mode: Literal["fast", "slow"] = argument("fast", "which way")
    dry_run: bool = argument(False, "only say what would happen", names=("--dry",))
    weights: list[float] | None = argument(None, "one per source")
    name: list[str] | None = argument(None, "repeatable", repeat=True)
    top: int | None = argument(None, "top N", exclusive="layers", names=("-N",))
    band: str | None = argument(None, "a band", exclusive="layers")
    max_new_tokens: int | None = argument(None, like=(GenerationArgs, "max_new_tokens"))


def parse(*argv: str, dashes: bool = False) -> Toy:
    return parse_options(Toy, list(argv), prog="toy", description="a toy", dashes=dashes)


def test_types_defaults_and_spellings():
    options = parse("in.jsonl", "--steps", "5", "--rate", "0.5", "--mode", "slow", "--dry", "--weights", "1", "2")
    assert options == Toy("in.jsonl", 5, 0.5, "slow", True, [1.0, 2.0], None, None, None, None)
    assert parse("x", "--name", "a", "--name", "b", "-N", "2").name == ["a", "b"]
    assert parse("x", "-N", "2").top == 2
    assert parse("x", "--max-new-tokens", "7", dashes=True).max_new_tokens == 7
    assert parse("x") == Toy("x")


@pytest.mark.parametrize(
    "argv",
    [
        ("x", "--mode", "medium"),  # not one of the Literal's words
        ("x", "--steps", "many"),  # not an int
        ("x", "-N", "2", "--band", "1:3"),  # two ways to say one thing
        (),  # the positional is required
    ],
)
def test_argparse_refuses(argv, capsys):
    with pytest.raises(ParserExit) as done:
        parse(*argv)
    assert done.value.code == 2


def test_ranges_are_the_declarations_own_and_reported_together():
    with pytest.raises(ConfigError) as error:
        parse("x", "--steps", "0", "--max_new_tokens", "0")
    message = str(error.value)
    assert "2 problems in the command line" in message
    assert "--steps=0 must be >= 1" in message
    # generation.max_new_tokens' own rule (config/options.py), and its help with the command's default
    declared = GenerationArgs.__dataclass_fields__["max_new_tokens"].metadata
    assert f"--max_new_tokens=0 {declared['range'].describe(0)}" in message
    assert Toy.__dataclass_fields__["max_new_tokens"].metadata["help"].startswith(declared["help"])
