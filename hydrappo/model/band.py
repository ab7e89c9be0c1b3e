"""Which decoder layers train: a band `start:end` of the layer list, anywhere in the stack, given
as layer indices (0-based, `end` exclusive, as a Python slice) or as fractions of the depth.

RL's gains concentrate in the middle of the stack (Zhang et al. 2026, "Is One Layer Enough?",
arXiv 2607.01232), which the top N layers never reach. A band keeps what the hydra is for: the
layers below it are frozen and run once, so at least one must stay below (`start >= 1`).

Indices name the same layers on every model, which is not the same place: "13:17" is the middle of
a 30-layer model and the top of an 18-layer one. Fractions ("0.43:0.57", "0.5:" to the top) name a
place in the depth and resolve per model to whole layers (`resolve_band`):

    start = round(start * L), end = round(end * L), a half rounding up;
    then 1 <= start <= L - 1 (a frozen layer stays below, a layer above it trains), end <= L,
    and end >= start + 1 (one layer at least).

On 30 layers "0.43:0.57" is 13:17 (12.9 -> 13, 17.1 -> 17); on 18 layers it is 8:10 (7.74 -> 8, 10.26 -> 10).
"""

from __future__ import annotations

import logging
import math
import re

logger = logging.getLogger("hydrappo")

_NUMBER = r"(\d+(?:\.\d+)?|\.\d+)"
_BAND = re.compile(rf"^\s*{_NUMBER}\s*:\s*{_NUMBER}?\s*$")

BAND_SYNTAX = (
    "START:END, 0-based layer indices with END exclusive (e.g. '12:16'; 'START:' runs to the top), "
    "or fractions of the depth (e.g. '0.43:0.57'; '0.5:' runs to the top)"
)


class BandSyntaxError(ValueError):
    """A trainable_layers text that is no band, as (the rule, what would work) for the config checks."""

    def __init__(self, text, rule: str, fix: str):
        super().__init__(f"{text!r} {rule}: {fix}")
        self.rule, self.fix = rule, fix


def parse_band(text) -> tuple:
    """A band as (start, end): ints for layer indices, floats for fractions of the depth, end None
    for a band that runs to the top.

    `"12:16"` -> (12, 16); `"12:"` -> (12, None), the band running to the top layer;
    `"0.43:0.57"` -> (0.43, 0.57) and `"0.5:"` -> (0.5, None), fractions of the depth.
    Raises BandSyntaxError (a ValueError) saying what is accepted for anything else, a mix of
    an index and a fraction ("13:0.5") included."""
    if (
        isinstance(text, (tuple, list))
        and len(text) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in text)
    ):
        return int(text[0]), int(text[1])
    match = _BAND.match(text) if isinstance(text, str) else None
    if match is None:
        raise BandSyntaxError(text, "is not a band of layers", f"write {BAND_SYNTAX}")
    start, end = match.groups()
    fractions = {"." in part for part in (start, end) if part}
    if len(fractions) > 1:
        raise BandSyntaxError(
            text,
            "mixes a layer index and a fraction of the depth",
            "write both as layer indices (e.g. '13:17') or both as fractions (e.g. '0.43:0.57')",
        )
    kind = float if fractions == {True} else int
    return kind(start), (kind(end) if end else None)


def is_fraction(band: tuple) -> bool:
    """Whether the band is given as fractions of the depth rather than layer indices."""
    return isinstance(band[0], float)


def format_band(band) -> str:
    start, end = band
    return f"'{start}:{'' if end is None else end}'"


def _round_half_up(x: float) -> int:
    # Python's round() rounds a half to even (round(4.5) == 4); a rule a user can do by hand is
    # "a half rounds up". The epsilon absorbs float error in products such as 0.15 * 30 = 4.499...
    return math.floor(x + 0.5 + 1e-9)


def _fraction_problem(band: tuple) -> tuple[str, str] | None:
    start, end = band
    if start >= 1 or (end is not None and end > 1):
        return (
            "is past the top (as fractions of the depth, START lies below 1 and END at most 1)",
            "fractions lie in 0..1 (e.g. '0.43:0.57' for the middle, '0.5:' for the top half)",
        )
    if end is not None and end <= start:
        return "is empty (END must be above START)", f"e.g. '{start}:{min(1.0, round(start + 0.15, 2))}'"
    return None


def band_problem(band: tuple, num_layers: int | None = None) -> tuple[str, str] | None:
    """What is wrong with a band for a model of `num_layers` decoder layers (None: not known
    yet, only the band's own shape is checked), as (the rule, what would work); None if it fits.
    A band of fractions is checked as the layers it resolves to."""
    if is_fraction(band):
        problem = _fraction_problem(band)
        if problem is not None or num_layers is None:
            return problem
        layers = resolve_band(band, num_layers)
        problem = band_problem(layers, num_layers)
        if problem is None:
            return None
        return f"resolves to {format_band(layers)} of {num_layers} layers, which {problem[0]}", problem[1]
    start, end = band
    if start < 1:
        return (
            "leaves no frozen layer below the band, and the hydra shares the frozen layers below it",
            "start at layer 1 or above, or train every layer with num_layers_unfrozen: -1",
        )
    if end is not None and end <= start:
        return "is empty (END must be above START)", f"e.g. '{start}:{start + 2}' for two layers"
    if num_layers is None:
        return None
    if start >= num_layers or (end is not None and end > num_layers):
        return (
            f"runs past the top of the model, which has {num_layers} decoder layers (0..{num_layers - 1})",
            f"end at {num_layers} or below, e.g. '{max(1, num_layers - 2)}:{num_layers}' for the top layers",
        )
    return None


def resolve_band(band: tuple, num_layers: int) -> tuple[int, int]:
    """The band as whole layers of a model of `num_layers`: an open end (`START:`) closed at the
    top; fractions resolved by the rule in this module's docstring."""
    start, end = band
    if not is_fraction(band):
        return start, num_layers if end is None else end
    first = max(1, min(num_layers - 1, _round_half_up(start * num_layers)))
    last = num_layers if end is None else min(num_layers, _round_half_up(end * num_layers))
    return first, max(last, first + 1)


def describe_band(text, num_layers: int) -> str:
    """How a band reads on a model: "trainable layers 0.43:0.57 of 30 -> 13:17"."""
    band = text if isinstance(text, tuple) else parse_band(text)
    start, end = resolve_band(band, num_layers)
    given = f"{band[0]}:{'' if band[1] is None else band[1]}"
    return f"trainable layers {given} of {num_layers} -> {start}:{end}"


def trainable_range(
    num_layers_unfrozen, trainable_layers, num_layers: int, adapters_everywhere: bool = False
) -> tuple[int, int]:
    """(start, end) of the layers that train: the band `trainable_layers` if given, else the top
    `num_layers_unfrozen` (-1 or >= num_layers: all); every layer with adapters everywhere.
    Raises ValueError (TypeError for a non-int N) saying what would work."""
    top = _resolve_num_unfrozen(num_layers_unfrozen, num_layers)
    if trainable_layers is None:
        return (0 if adapters_everywhere else num_layers - top), num_layers
    band = parse_band(trainable_layers)
    problem = band_problem(band, num_layers)
    if problem is None and adapters_everywhere:
        problem = (
            "cannot be combined with adapters in every layer (lora_layers='all')",
            "use lora_layers='top' for adapters in the band's layers only",
        )
    if problem is not None:
        raise ValueError(f"trainable_layers={format_band(band)} {problem[0]}; {problem[1]}.")
    if is_fraction(band):
        logger.info(describe_band(band, num_layers))
    return resolve_band(band, num_layers)


def _resolve_num_unfrozen(requested, num_layers: int) -> int:
    if isinstance(requested, bool) or not isinstance(requested, int):
        raise TypeError(f"num_layers_unfrozen must be an int, got {requested!r}.")
    if requested == -1 or requested >= num_layers:
        return num_layers
    if requested < -1:
        raise ValueError(
            f"num_layers_unfrozen={requested} is out of range: use 0..{num_layers} (the model has {num_layers} "
            "decoder layers), 0 to train only the heads, or -1 to train the whole model."
        )
    return requested


def band_as_fractions(start: int, end: int, num_layers: int) -> str:
    """Layers start:end of a model of `num_layers` as the fractions of the depth that resolve back to
    them (`resolve_band`), with the fewest decimals (two at least): 13:17 of 30 -> "0.43:0.57", 8:10
    of 18 -> "0.44:0.56"; a band that ends at the top -> "0.9:" (a bare 1 would read as a layer index)."""
    if not 1 <= start < end <= num_layers:
        raise ValueError(f"{start}:{end} is no band of {num_layers} layers (1 <= start < end <= {num_layers}).")

    def fraction(layer: int, decimals: int) -> str:
        return f"{layer / num_layers:.{decimals}f}".rstrip("0")  # "0.50" -> "0.5"; "0.00" -> "0." (refused below)

    for decimals in range(2, 12):
        first, last = fraction(start, decimals), ("" if end == num_layers else fraction(end, decimals))
        if first.endswith(".") or last.endswith("."):
            continue  # too few decimals to tell the layer from 0
        if resolve_band(parse_band(f"{first}:{last}"), num_layers) == (start, end):
            return f"{first}:{last}"
    raise ValueError(f"{start}:{end} of {num_layers} layers has no fraction that resolves back to it.")
