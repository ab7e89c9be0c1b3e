"""Reading a config: YAML sections as the defaults of transformers' HfArgumentParser, so
that `--option value` on the command line wins over the file."""

from __future__ import annotations

import argparse
import dataclasses
import decimal
import difflib
import functools
import re
from pathlib import Path

import yaml

from ..usercode import ParserExit
from .checks import validate
from .options import ConfigError
from .sections import Config, sections_of
from .trl_names import names_for, translate_words, translate_yaml


class DuplicateKeyError(yaml.YAMLError):
    """A key given twice in one YAML mapping; str() names it and both lines."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last).
    Merge keys (`<<: *defaults`) work as in yaml.safe_load: a key written in the mapping
    overrides the merged one, which is what they are for, not a repeat."""


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _refuse_repeated_keys(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> None:
    """DuplicateKeyError for a key written twice in `node` itself, or in a mapping it merges."""
    seen: dict = {}
    for key_node, value_node in node.value:
        if key_node.tag == _MERGE_TAG:
            merged = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            for mapping in merged:
                if isinstance(mapping, yaml.MappingNode):
                    _refuse_repeated_keys(loader, mapping)
            continue
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise DuplicateKeyError(f"key {key!r} is given twice (lines {seen[key]} and {line}); keep one of them")
        seen[key] = line


def _mapping_without_duplicates(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    _refuse_repeated_keys(loader, node)
    return yaml.SafeLoader.construct_mapping(loader, node, deep)  # (which merges the `<<` keys)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)

# YAML 1.1 reads `12:16` as a base-60 integer (736); YAML 1.2 dropped that, and a band of layers
# (model.trainable_layers: 12:16) means the text. Integers are resolved without the base-60 form.
_INT_TAG = "tag:yaml.org,2002:int"
_UniqueKeyLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _INT_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_UniqueKeyLoader.add_implicit_resolver(
    _INT_TAG,
    re.compile(r"""^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"""),
    list("-+0123456789"),
)


def load_yaml(text: str):
    """yaml.safe_load, except that a key given twice in one mapping is a yaml.YAMLError."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)


def close_match(word: str, valid) -> str | None:
    """The valid name closest to a misspelt `word` (difflib's ratio), or None when none is close."""
    match = difflib.get_close_matches(word, list(valid), n=1)
    return match[0] if match else None


def _flatten_yaml(data: dict, source: str, sections: dict, flat_names: bool = False) -> dict:
    """{option: value} of a YAML file's sections; `flat_names` (a dict `args` given in Python, as
    TRL's configs take every option: `args={"num_generations": 4, "ppo": {...}}`) also takes option
    names, hydrappo's or TRL's, at the top level beside the sections."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of sections ({', '.join(sections)}).")
    flat = {}
    every = {f.name for cls in sections.values() for f in dataclasses.fields(cls)}
    loose = {key: value for key, value in data.items() if flat_names and key not in sections}
    for section, values in data.items():
        if section in loose:
            continue
        if section not in sections:
            raise ConfigError(f"{source}: unknown section {section!r}; valid sections: {', '.join(sections)}.")
        values = values or {}
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: section {section!r} must be a mapping of option: value.")
        valid = [f.name for f in dataclasses.fields(sections[section])]
        for key, value in values.items():
            trl = translate_yaml(key, value, every, source) if key not in valid else None
            if trl is not None:  # TRL's GRPOConfig name of an option (config/trl_names.py)
                if trl[0] in flat or trl[0] in values:
                    raise ConfigError(
                        f"{source}: {key} (TRL's name) and {trl[0]} are the same option; give one of them."
                    )
                flat[trl[0]] = trl[1]
                continue
            if key not in valid:
                guess = close_match(str(key), valid)
                hint = f" Did you mean {guess!r}?" if guess else ""
                raise ConfigError(
                    f"{source}: unknown key {key!r} in section {section!r}.{hint} Valid keys: {', '.join(valid)}."
                )
            flat[key] = value
    for key, value in loose.items():
        option, value = _flat_option(str(key), value, every, sections, source)
        if option in flat and option == key:
            raise ConfigError(f"{source}: {key} is given at the top level and in its section; give it once.")
        if option in flat:
            raise ConfigError(f"{source}: {key} (TRL's name) and {option} are the same option; give one of them.")
        flat[option] = value
    return flat


def _flat_option(key: str, value, every: set, sections: dict, source: str) -> tuple[str, object]:
    """(option, value) of a name given at the top level of `args`: a hydrappo option, or TRL's name
    of one (config/trl_names.py); ConfigError naming the close names for any other."""
    if key in every:
        return key, value
    trl = translate_yaml(key, value, every, source)
    if trl is not None:
        return trl
    trl = names_for(every)
    names = [*sections, *every, *(name for name in trl if trl[name].option in every)]
    close = difflib.get_close_matches(key, names, n=3)
    hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
    raise ConfigError(
        f"{source}: {key!r} is neither a section ({', '.join(sections)}) nor an option, hydrappo's or TRL's "
        f"GRPOConfig name of one.{hint} An option goes in its section ({{'ppo': {{'batch_size': 16}}}}) or at the "
        "top level ({'batch_size': 16})."
    )


# Text options that also take a YAML list (on the command line: comma-separated).
TEXT_LISTS = {"reward_fn", "tools", "loss_type"}  # loss_type: dpo's, a list of loss names
TEXT_MAPS = {"environment_factory"}  # {name: text}: one of several environments per row
# Mappings kept as YAML gives them (on the command line: YAML text); config/task.py checks them.
YAML_MAPS = {"task_config", "tasks"}


def _typed_defaults(parser, values: dict, source: str) -> dict:
    """Convert YAML values with the parser's own type for each option, so that a file
    and the command line accept the same spellings (YAML reads `3e-6` as a string)."""
    actions = {}
    for action in parser.options:  # a bool option's --no_X action shares its dest, without a type
        if action.dest not in actions or actions[action.dest].type is None:
            actions[action.dest] = action
    typed = {}
    for key, value in values.items():
        action = actions[key]
        convert = action.type
        kind = getattr(convert, "__name__", convert)
        kind = {"string_to_bool": "true/false", "str": "text", "int": "whole number", "float": "number"}.get(kind, kind)
        is_list = action.nargs in ("+", "*")
        try:
            if value is None or convert is None:
                typed[key] = value
            elif key in TEXT_LISTS and isinstance(value, list):  # several values of a text option
                if not all(isinstance(v, str) for v in value):
                    raise ValueError(value)
                typed[key] = value
            elif key in YAML_MAPS and isinstance(value, dict):
                typed[key] = value
            elif key in TEXT_MAPS and isinstance(value, dict):
                if not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
                    raise ValueError(value)
                typed[key] = value
            elif is_list:
                if not isinstance(value, list):
                    raise ConfigError(f"{source}: {key}={value!r} must be a list, e.g. [{value!r}].")
                typed[key] = [convert(v) if isinstance(v, str) or convert is not str else str(v) for v in value]
            elif isinstance(value, (list, dict)) or (isinstance(value, bool) and convert in (whole_number, float)):
                raise ValueError(value)  # YAML's true/false are not numbers
            elif isinstance(value, str) or (convert in (float, whole_number) and isinstance(value, (int, float))):
                typed[key] = convert(value)
            elif convert is str and not isinstance(value, str):
                raise ValueError(value)
            else:
                typed[key] = value
        except ConfigError:
            raise
        except (TypeError, ValueError, argparse.ArgumentTypeError):
            raise ConfigError(
                f"{source}: {key}={value!r} is not a valid {kind}; write a {kind} (see --help for every option)."
            ) from None
    return typed


def whole_number(value) -> int:
    """int(), that also reads a whole number in scientific notation (`1e4`, YAML's `1.0e+4`), so
    that such a count reaches the range check, which names its bound, rather than failing here."""
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(value)
        return int(value)
    text = str(value).strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = decimal.Decimal(text)
    except decimal.InvalidOperation:
        raise ValueError(value) from None
    # (the exponent's bound keeps int() from building a number of a billion digits for 1e999999999)
    if not number.is_finite() or number != number.to_integral_value() or number.adjusted() > 100:
        raise ValueError(value)
    return int(number)


whole_number.__name__ = "int"  # argparse's message: "invalid int value: 'x'"


# A negative number as the command line may spell it: argparse itself reads only -1 and -0.5 as
# numbers, so -1e-4, -1. or -inf after an option would look like an option of its own.
_NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^-(inf|nan)$")


def _spell_negative_numbers(words: list[str], options) -> tuple[list[str], dict]:
    """`words` with each negative-number value after an option written so that argparse reads it as
    a value: `--option=-1e-4` for an option of one value; with a leading space in a list (argparse
    takes a word with a space for a value, int() and float() ignore it). Returns the words and, by
    option, the values spaced, to give back as written (text lists, error messages)."""
    by_string = {string: action for action in options for string in action.option_strings}
    spelt, spaced, action = [], {}, None
    for word in words:
        if word in by_string:
            action = by_string[word]
        elif action is not None and _NEGATIVE_NUMBER.match(word):
            if action.nargs in (None, "?") and spelt[-1] in action.option_strings:
                spelt[-1], action = f"{spelt[-1]}={word}", None
                continue
            if action.nargs in ("+", "*"):
                word = " " + word
                spaced.setdefault(action.dest, set()).add(word)
        elif word.startswith("-"):
            action = None
        spelt.append(word)
    return spelt, spaced


@functools.cache
def _parser_class():
    from transformers import HfArgumentParser

    class ConfigParser(HfArgumentParser):
        """HfArgumentParser that shows a `Literal[...]` option's words in --help without argparse
        refusing other words on the command line, and leaves a field's range (its metadata) out of
        argparse: config/checks.py reports a wrong word or number with the config's other problems,
        all at once, each with its fix (as it does for the YAML file). `options` lists the
        argparse actions it made (argparse keeps its own list private)."""

        def __init__(self, *args, **kwargs):
            self.options = []
            super().__init__(*args, **kwargs)

        def exit(self, status=0, message=None):  # hydrappo's own parser (usercode.CommandParser)
            try:
                super().exit(status, message)
            except SystemExit as done:
                raise ParserExit(done.code) from None

        def add_argument(self, *args, **kwargs):
            kwargs.pop("range", None)  # hydrappo's own field metadata (config/values.py), not argparse's
            if kwargs.get("type") is int:
                kwargs["type"] = whole_number
            choices = kwargs.pop("choices", None)
            if choices is not None:
                kwargs.update(type=str, metavar=kwargs.get("metavar") or "{" + ",".join(map(str, choices)) + "}")
            action = super().add_argument(*args, **kwargs)
            self.options.append(action)
            return action

    return ConfigParser


def _given_on_command_line(words: list[str], options) -> set[str]:
    """The options (by dest) that the command line names."""
    by_string = {string: action.dest for action in options for string in action.option_strings}
    return {by_string[word.split("=")[0]] for word in words if word.split("=")[0] in by_string}


# Two ways to say which layers train; the command line wins over the file, as for every option.
_LAYER_CHOICES = ("num_layers_unfrozen", "trainable_layers")


def _one_choice_of_layers(values: dict, in_file: set[str], on_command_line: set[str], config_cls) -> None:
    """Where one of model.num_layers_unfrozen / model.trainable_layers is on the command line and
    the other only in the file, the file's one gives way (to its default). Both on the command line,
    or both in the file, are refused."""
    if "trainable_layers" not in values:
        return
    for where, given in (("the command line", on_command_line), ("the config", in_file - on_command_line)):
        if all(name in given for name in _LAYER_CHOICES) and values["trainable_layers"] is not None:
            raise ConfigError(
                f"{where} sets both model.num_layers_unfrozen and model.trainable_layers, two ways to say which layers "
                "train: keep one (trainable_layers 'START:END' for a band, num_layers_unfrozen N for the top N layers)."
            )
    for given, other in (_LAYER_CHOICES, _LAYER_CHOICES[::-1]):
        if given in on_command_line and other not in on_command_line and other in in_file:
            model_fields = {f.name: f for f in dataclasses.fields(sections_of(config_cls)["model"])}
            values[other] = model_fields[other].default


def config_parser(config_cls=Config, **kwargs):
    """The command-line parser of a config class's options (transformers' HfArgumentParser)."""
    return _parser_class()(tuple(sections_of(config_cls).values()), **kwargs)


def parse_config(
    config_path: str | Path | None = None,
    overrides: list[str] | None = None,
    config_cls=Config,
    data: dict | None = None,
    check: bool = True,
):
    """Read a YAML config (or `data`, a mapping of the same shape) and apply command-line
    overrides (`--key value`).

    Returns a `config_cls` (Config, RewardConfig or SFTConfig), with relative input paths
    anchored at the config file's folder and every option checked (unless `check` is False:
    the Python API checks once its objects are in). Unknown keys in the file or on the
    command line are errors that list the valid ones.
    """
    sections = sections_of(config_cls)
    defaults = {}
    if config_path is not None:
        path = Path(config_path)
        if not path.is_file():
            what = "is a folder, not a file" if path.is_dir() else "does not exist"
            raise ConfigError(f"config file {str(path)!r} {what}; give the path of a YAML config (see examples/).")
        try:
            data = load_yaml(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as error:
            raise ConfigError(f"config file {path}: not UTF-8 text ({error}); save it as UTF-8.") from None
        except DuplicateKeyError as error:
            raise ConfigError(f"config file {path}: {error}.") from None
        except yaml.YAMLError as error:
            raise ConfigError(f"config file {path}: not valid YAML: {error}") from None
        defaults = _flatten_yaml(data, str(path), sections)
    elif data is not None:
        defaults = _flatten_yaml(data, "args", sections, flat_names=True)

    # exit_on_error=False: a bad value on the command line is a ConfigError like any other,
    # not argparse's usage text of every option followed by an exit.
    # allow_abbrev=False: a misspelt option is an error, not a guess at another one.
    parser = config_parser(config_cls, exit_on_error=False, allow_abbrev=False)
    parser.set_defaults(**_typed_defaults(parser, defaults, str(config_path) if config_path is not None else "args"))
    words = translate_words(list(overrides or []), {action.dest for action in parser.options})  # TRL's names
    words, spaced = _spell_negative_numbers(words, parser.options)
    try:
        args, remaining = parser.parse_known_args(words)
    except argparse.ArgumentError as error:
        option, message = (error.argument_name or "").split("/")[0], error.message
        for word in set().union(*spaced.values()):
            message = message.replace(repr(word), repr(word[1:]))
        raise ConfigError(
            f"command line: {option}: {message}. Give it a value of the option's type (see --help); a value "
            f"that starts with '-' can be written {option}=VALUE."
        ) from None
    if remaining:
        # (a bool option's --no_X action shares its dest: each option once)
        valid = sorted({action.dest for action in parser.options if action.dest != "help"})
        guesses = [
            f"--{match}"
            for word in remaining
            if word.startswith("-")
            for match in [close_match(word.lstrip("-").replace("-", "_"), valid)]
            if match
        ]
        hint = f" Did you mean {', '.join(guesses)}?" if guesses else ""
        raise ConfigError(
            f"unknown command-line option(s) {' '.join(remaining)}.{hint} The valid options: --{', --'.join(valid)}."
        )
    values = vars(args)
    _one_choice_of_layers(values, set(defaults), _given_on_command_line(words, parser.options), config_cls)
    for dest, words in spaced.items():  # a text list keeps its values as written
        values[dest] = [value[1:] if isinstance(value, str) and value in words else value for value in values[dest]]
    built = {}
    for section, cls in sections.items():
        built[section] = cls(**{f.name: values[f.name] for f in dataclasses.fields(cls) if f.init})
    config = config_cls(**built)
    if config_path is not None:
        config.resolve_paths(Path(config_path).resolve().parent)
        config.config_file = str(Path(config_path).resolve())
    if check:
        validate(config)
    return config
