"""Which decoder layers train: a band `start:end` of the layer list (0-based, `end` exclusive,
as a Python slice), anywhere in the stack.

RL's gains concentrate in the middle of the stack (Zhang et al. 2026, "Is One Layer Enough?",
arXiv 2607.01232), which the top N layers never reach. A band keeps what the hydra is for: the
layers below it are frozen and run once, so at least one must stay below (`start >= 1`).
"""

from __future__ import annotations

import re

_BAND = re.compile(r"^\s*(\d+)\s*:\s*(\d*)\s*$")

BAND_SYNTAX = "START:END (0-based layer indices, END exclusive, e.g. '12:16'; 'START:' runs to the top)"


def parse_band(text) -> tuple[int, int | None]:
    """`"12:16"` -> (12, 16); `"12:"` -> (12, None), the band running to the top layer.
    Raises ValueError with the accepted syntax for anything else."""
    if (
        isinstance(text, (tuple, list))
        and len(text) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in text)
    ):
        return int(text[0]), int(text[1])
    match = _BAND.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"{text!r} is not a band of layers: write {BAND_SYNTAX}")
    start, end = match.groups()
    return int(start), (int(end) if end else None)


def format_band(band) -> str:
    start, end = band
    return f"'{start}:{'' if end is None else end}'"


def band_problem(band: tuple[int, int | None], num_layers: int | None = None) -> tuple[str, str] | None:
    """What is wrong with a band for a model of `num_layers` decoder layers (None: not known
    yet, only the band's own shape is checked), as (the rule, what would work); None if it fits."""
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


def resolve_band(band: tuple[int, int | None], num_layers: int) -> tuple[int, int]:
    """The band with an open end (`START:`) closed at the top of the model."""
    start, end = band
    return start, num_layers if end is None else end


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
