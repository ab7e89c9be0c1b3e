"""What a reward function is called with (rewards/functions.py), and what its call tells when it
fails: the arguments of its convention and the dataset columns' values, a row without a value
named in the error; async functions' results awaited together."""

from __future__ import annotations

from ..prompts import trl_arguments
from .context import RewardContext


def completion_text(completion) -> str:
    """A completion as text: TRL's conversational completions are [{"role": "assistant", "content": text}]."""
    if isinstance(completion, list):
        return "".join(turn.get("content") or "" for turn in completion if isinstance(turn, dict))
    return completion


def call_arguments(
    convention: str,
    accepts,
    samples,
    prompts,
    outputs,
    *,
    columns=None,
    completion_ids=None,
    prompt_messages=None,
    context=None,
) -> dict:
    """The keyword arguments of one call in `convention` ("trlX" or "TRL"), each only where
    `accepts(name)`: trlX's samples/prompts/outputs or TRL's prompts/completions/completion_ids
    (conversational prompts in TRL's shapes: prompts.trl_arguments), then each dataset column."""
    if convention == "trlX":
        kwargs = {"samples": list(samples), "prompts": list(prompts), "outputs": list(outputs)}
    elif prompt_messages is not None:  # TRL's conversational format
        kwargs = dict(zip(("prompts", "completions"), trl_arguments(prompt_messages, outputs)))
    else:
        kwargs = {"prompts": list(prompts), "completions": list(outputs)}
        if completion_ids is not None:
            kwargs["completion_ids"] = [list(ids) for ids in completion_ids]
    if convention == "TRL":  # trainer_state, log_metric, log_extra (a context of their own outside a run)
        kwargs.update((context or RewardContext()).arguments())
    kwargs = {name: value for name, value in kwargs.items() if accepts(name)}
    for name, values in (columns or {}).items():
        if accepts(name) and name not in kwargs:
            if len(values) != len(samples):
                raise ValueError(f"column {name!r} has {len(values)} values for {len(samples)} samples.")
            kwargs[name] = list(values)
    return kwargs


def is_missing(value) -> bool:
    """A table cell without a value: None (a missing key, an empty CSV cell) or a float NaN."""
    return value is None or (isinstance(value, float) and value != value)


def missing_value(kwargs: dict, columns, row_names=None) -> tuple[int, str]:
    """(the first sample whose value of a column passed in `kwargs` is missing, a sentence naming it and
    its row); (0, "") when every value is there. `row_names`: each sample's table and row."""
    found = [(i, name) for name in kwargs if name in columns for i, v in enumerate(kwargs[name]) if is_missing(v)]
    if not found:
        return 0, ""
    row, name = min(found)
    return row, f" {row_names[row] if row_names else f'Sample {row}'} has no {name!r} (None)."


def await_together(pending: list) -> list:
    """The results of the awaitables async reward functions returned, awaited together (TRL's
    asyncio.gather); an exception comes back in its place."""
    import asyncio

    async def gather():
        return await asyncio.gather(*pending, return_exceptions=True)

    return asyncio.run(gather()) if pending else []
