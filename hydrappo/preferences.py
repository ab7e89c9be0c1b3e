"""Preference pairs, the one reader of the reward stage and DPO: TRL's three preference formats,
checked, with the bad rows counted, then tokenized.

- **standard**: `prompt`, `chosen`, `rejected` as text;
- **conversational**: message lists (`[{"role": ..., "content": ...}, ...]`): the prompt's turns,
  and each answer's (usually one assistant turn), rendered with the tokenizer's chat template;
- **implicit prompt**: only `chosen` and `rejected` (text or message lists), whose shared
  beginning is the prompt, as TRL's `extract_prompt` reads it.

Which format a table holds is read from its values; the columns are renamed by option
(`data.prompt_column`, `data.chosen_column`, `data.rejected_column`). `data.prompt_column: null`
keeps the older meaning of the reward stage: chosen and rejected are whole texts, with no prompt.

Rows that cannot teach anything are skipped and counted, with their row numbers, in one warning:
an empty answer, chosen equal to rejected, an implicit pair with no shared beginning, a prompt
that leaves no room for its answers under `data.max_length`. A table that is malformed (a value
that is neither text nor a message list, or a format that changes from row to row) is an error
that says which row. Reading writes nothing.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

from .data import DataError, encode_prompts, read_table, tokenize_responses
from .prompts import conversation_problem, format_prompt

logger = logging.getLogger("hydrappo")

FORMATS = ("standard", "conversational", "implicit prompt")


class PreferenceTable(dict):
    """{column: values} of the pairs kept, the prompt column holding each pair's prompt (text, a
    message list, or "" without one), plus what was read: `format` (one of FORMATS, or "whole
    texts"), `conversational` (message lists), `skipped` ({reason: [row numbers, from 1]})."""

    format: str = "standard"
    conversational: bool = False
    skipped: dict

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.skipped = {}


def _prompt_key(data) -> str:
    return data.prompt_column or "prompt"


def prompt_groups(table: dict, data) -> list[str]:
    """One hashable key per pair, equal for pairs of the same prompt: what a held-out split by
    prompt groups by (split_by_prompt). Whole texts without a prompt are each their own group."""
    prompts = table[_prompt_key(data)]
    if not data.prompt_column and not getattr(table, "format", "") == "implicit prompt":
        return [str(i) for i in range(len(prompts))]
    return [json.dumps(p, sort_keys=True) if isinstance(p, list) else p for p in prompts]


def _kind(value, where: str, number: int, column: str) -> str:
    """'text' or 'messages', or a DataError naming the row."""
    if isinstance(value, str):
        return "text"
    if isinstance(value, (list, tuple)):
        problem = conversation_problem(value)
        if problem:
            raise DataError(
                f"{where}: row {number}: the {column} {problem}; a message list holds "
                '{"role": ..., "content": ...} turns.'
            )
        return "messages"
    shown = "no value (None)" if value is None else f"a {type(value).__name__} ({str(value)[:40]!r})"
    raise DataError(
        f"{where}: row {number} has {shown} as its {column}; it must be text or a message list. Fill it in or "
        "drop the row."
    )


def _turns(value) -> list[dict]:
    """A message list as written (`datasets` gives each turn every key any turn has, as None)."""
    return [{key: item for key, item in turn.items() if item is not None} for turn in value]


def shared_text_prompt(chosen: str, rejected: str) -> str:
    """The longest shared beginning of two texts, as TRL's extract_prompt reads it: cut back before
    a space that ends it, so the answers begin with their space as a tokenizer expects."""
    index = next((i for i, (a, b) in enumerate(zip(chosen, rejected)) if a != b), min(len(chosen), len(rejected)))
    if index and chosen[index - 1] == " ":
        index -= 1
    return chosen[:index]


def shared_turns(chosen: list, rejected: list) -> int:
    """How many first turns two conversations share: the implicit prompt's turns."""
    count = 0
    for a, b in zip(chosen, rejected):
        if a != b:
            break
        count += 1
    return count


def read_preference_table(path, data, setting: str = "data.train_file", split: str | None = None) -> PreferenceTable:
    """The pairs of `path` in any of TRL's preference formats, checked, the bad rows skipped and
    counted (the margins as floats): what can be refused before a tokenizer loads."""
    prompt_key, margin_column = _prompt_key(data), getattr(data, "margin_column", None)  # the reward stage's
    names = {prompt_key: "data.prompt_column", data.chosen_column: "data.chosen_column"}
    names[data.rejected_column] = "data.rejected_column"
    optional = ([prompt_key] if data.prompt_column else []) + ([margin_column] if margin_column else [])
    raw = read_table(
        path,
        [data.chosen_column, data.rejected_column],
        optional,
        setting=setting,
        split=split or data.split,
        subset=data.subset,
        options=names,
    )
    where = f"{setting}={path}" if isinstance(path, (str, Path)) else setting
    chosen, rejected = raw[data.chosen_column], raw[data.rejected_column]
    prompts = raw.get(prompt_key) if data.prompt_column else None
    if data.prompt_column and prompts is None and data.prompt_column != "prompt":
        raise DataError(
            f"{where} has no column {data.prompt_column!r} (data.prompt_column). Name the column that holds the "
            "prompt, or leave data.prompt_column at 'prompt' on a table without one: the prompt is then the shared "
            "beginning of chosen and rejected."
        )
    table = PreferenceTable()
    table.format = "standard" if prompts is not None else ("implicit prompt" if data.prompt_column else "whole texts")
    kinds = set()
    kept = {prompt_key: [], data.chosen_column: [], data.rejected_column: []}
    margins = raw.get(margin_column) if margin_column else None
    if margin_column and margins is None:
        raise DataError(f"{where}: no margin column {margin_column!r}; unset data.margin_column or add it.")
    kept_margins = []

    def skip(reason: str, number: int) -> None:
        table.skipped.setdefault(reason, []).append(number)

    for row, (good, bad) in enumerate(zip(chosen, rejected)):
        number = row + 1
        kind = _kind(good, where, number, data.chosen_column)
        if _kind(bad, where, number, data.rejected_column) != kind:
            raise DataError(
                f"{where}: row {number} has one answer as text and the other as a message list; give both the same way."
            )
        prompt = prompts[row] if prompts is not None else None
        if prompt is not None and _kind(prompt, where, number, prompt_key) == "messages" and kind == "text":
            raise DataError(
                f"{where}: row {number} has its prompt as a message list and its answers as text; give the answers as "
                'message lists too ([{"role": "assistant", "content": ...}]), or the prompt as text.'
            )
        kinds.add(kind)
        if len(kinds) > 1:
            raise DataError(
                f"{where}: row {number} holds message lists where earlier rows hold text (or the other way round); "
                "give every row in one format."
            )
        if kind == "messages":
            good, bad = _turns(good), _turns(bad)
        if prompt is None and data.prompt_column:  # the implicit prompt: the shared beginning
            if kind == "messages":
                count = shared_turns(good, bad)
                prompt, good, bad = good[:count], good[count:], bad[count:]
            else:
                prompt = shared_text_prompt(good, bad)
                good, bad = good[len(prompt) :], bad[len(prompt) :]
            if not prompt:
                skip("chosen and rejected share no beginning, so there is no prompt", number)
                continue
        elif prompt is None:
            prompt = ""
        elif isinstance(prompt, (list, tuple)):
            prompt = _turns(prompt)
        if kind == "messages":
            empty = lambda turns: not turns or all(not str(t.get("content", "")).strip() for t in turns)  # noqa: E731
            if not all(t.get("role") == "assistant" for t in good[-1:] + bad[-1:]) and good and bad:
                raise DataError(
                    f"{where}: row {number}: an answer's last turn is not the assistant's; chosen and rejected hold "
                    'the answer\'s turns ([{"role": "assistant", "content": ...}]).'
                )
        else:
            empty = lambda text: not text.strip()  # noqa: E731
        if empty(good) or empty(bad):
            skip("an empty answer", number)
            continue
        if good == bad:
            skip("chosen equal to rejected", number)
            continue
        if data.prompt_column and isinstance(prompt, str) and not prompt.strip():
            skip("an empty prompt", number)
            continue
        kept[prompt_key].append(prompt)
        kept[data.chosen_column].append(good)
        kept[data.rejected_column].append(bad)
        if margins is not None:
            kept_margins.append(_margin(margins[row], where, number, margin_column))
    table.conversational = kinds == {"messages"}
    if table.conversational and table.format == "standard":
        table.format = "conversational"
    table.update(kept)
    if margin_column:
        table[margin_column] = kept_margins
    report_skipped(table.skipped, len(chosen), where)
    if not table[data.chosen_column]:
        raise DataError(f"{where}: none of its {len(chosen)} rows is a usable pair (see the warning above).")
    if table.format == "implicit prompt":
        logger.info("%s: no prompt column; each pair's prompt is the shared beginning of chosen and rejected", where)
    return table


def _margin(value, where: str, number: int, column: str) -> float:
    try:
        margin = float(value)
    except (TypeError, ValueError):
        raise DataError(f"{where}: row {number}: the margin column {column!r} holds {value!r}, not a number.") from None
    if not math.isfinite(margin):
        raise DataError(f"{where}: row {number}: the margin column {column!r} holds {value!r}, not a finite number.")
    return margin


def report_skipped(skipped: dict, rows: int, where: str) -> None:
    """One warning for every row skipped, by reason, with the first row numbers (counted from 1)."""
    if not skipped:
        return
    parts = []
    for reason, numbers in skipped.items():
        shown = ", ".join(map(str, numbers[:8])) + (f" and {len(numbers) - 8} more" if len(numbers) > 8 else "")
        parts.append(f"{len(numbers)} with {reason} (row{'s' if len(numbers) > 1 else ''} {shown})")
    total = sum(len(numbers) for numbers in skipped.values())
    logger.warning("%s: %d of %d rows skipped: %s.", where, total, rows, "; ".join(parts))


@dataclass
class PreferencePairs:
    """Tokenized preference pairs; `prompts` are the raw prompts (text, or message lists), what the
    held-out split groups by. `answers_end_turn`: the answers end with the chat template's end of
    turn (conversational pairs), so no EOS is added."""

    prompts: list
    prompt_ids: list[list[int]]
    chosen_ids: list[list[int]]
    rejected_ids: list[list[int]]
    margins: list[float] | None = None
    skipped: dict = field(default_factory=dict)
    no_room: frozenset = frozenset()  # pairs whose prompt leaves no room under data.max_length

    def __len__(self) -> int:
        return len(self.chosen_ids)

    def usable(self, index=None) -> PreferencePairs:
        """The pairs `index` (default all) less those whose prompt leaves no room for an answer."""
        index = range(len(self)) if index is None else index
        return self.subset([i for i in index if i not in self.no_room])

    def subset(self, index: list[int]) -> PreferencePairs:
        pick = lambda values: [values[i] for i in index]  # noqa: E731
        return PreferencePairs(
            pick(self.prompts),
            pick(self.prompt_ids),
            pick(self.chosen_ids),
            pick(self.rejected_ids),
            pick(self.margins) if self.margins is not None else None,
            self.skipped,
        )


def conversation_answer(prompt: list, answer: list, tokenizer, system_prompt: str | None, prompt_text: str) -> str:
    """The text of an answer's turns as the chat template renders them after `prompt`: the
    template's text of the whole conversation less the prompt's (with its generation prompt), as
    TRL renders a conversational pair."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt and prompt[0]["role"] != "system" else []
    whole = tokenizer.apply_chat_template([*messages, *prompt, *answer], tokenize=False)
    if not whole.startswith(prompt_text):
        raise DataError(
            "the chat template renders a conversation's prompt differently when an answer follows it, so the answer's "
            "tokens cannot be told from the prompt's; give the pairs as text (prompt, chosen, rejected) instead."
        )
    return whole[len(prompt_text) :]


def load_preference_pairs(
    path: str | Path,
    tokenizer,
    data,
    setting: str = "data.train_file",
    split: str | None = None,
    table: dict | None = None,
) -> PreferencePairs:
    """Read (or take the `table` read_preference_table read) and tokenize the pairs: prompts as the
    data options format them (a message list through the chat template), answers cut to
    `data.max_response_length`, and under `data.max_length` to what the prompt leaves. A pair whose
    prompt leaves no room is dropped and counted."""
    table = table if table is not None else read_preference_table(path, data, setting, split)
    prompt_key = _prompt_key(data)
    prompts, chosen, rejected = table[prompt_key], table[data.chosen_column], table[data.rejected_column]
    margin_column = getattr(data, "margin_column", None)
    margins = table[margin_column] if margin_column else None
    conversational = getattr(table, "conversational", False) or any(isinstance(c, list) for c in chosen[:1])
    has_prompt = any(prompts) if prompts else False
    if has_prompt:
        prompt_ids = encode_prompts(prompts, tokenizer, data)
        special = False
    else:
        # Whole texts in chosen/rejected: they are tokenized like a prompt (with BOS etc.).
        prompt_ids, special = [[] for _ in chosen], True
    if conversational:
        texts = [format_prompt(p, tokenizer, True, data.system_prompt) for p in prompts]
        answer = lambda p, a, t: conversation_answer(p, a, tokenizer, data.system_prompt, t)  # noqa: E731
        chosen = [answer(p, a, t) for p, a, t in zip(prompts, chosen, texts)]
        rejected = [answer(p, a, t) for p, a, t in zip(prompts, rejected, texts)]
    append_eos = data.append_eos and not conversational  # the template ends each turn itself
    chosen_ids = tokenize_responses(chosen, tokenizer, data.max_response_length, append_eos, special)
    rejected_ids = tokenize_responses(rejected, tokenizer, data.max_response_length, append_eos, special)
    skipped = dict(getattr(table, "skipped", {}))
    max_length = getattr(data, "max_length", None)
    no_room = []
    if max_length:
        room = [max_length - len(ids) for ids in prompt_ids]
        no_room = [i for i in range(len(room)) if room[i] < 1]
        if len(no_room) == len(room):
            raise DataError(
                f"{setting}: every prompt is at least data.max_length={max_length} tokens long, which leaves no room "
                "for an answer; raise data.max_length or lower data.max_prompt_length."
            )
        if no_room:
            reason = f"a prompt that leaves no room for its answers under data.max_length={max_length}"
            skipped[reason] = [i + 1 for i in no_room]
            report_skipped({reason: skipped[reason]}, len(room), setting)
        chosen_ids = [ids[: max(room[i], 0)] for i, ids in enumerate(chosen_ids)]
        rejected_ids = [ids[: max(room[i], 0)] for i, ids in enumerate(rejected_ids)]
    # Rows stay where the table had them (the held-out split's row numbers index them); the ones
    # with no room are left out by `usable`.
    return PreferencePairs(list(prompts), prompt_ids, chosen_ids, rejected_ids, margins, skipped, frozenset(no_room))
