"""Prompts: load them from local files, format them, tokenize them, batch them.

Files are read with `datasets` (json/jsonl, csv, parquet, txt); the order of prompts
for training comes from `PromptSampler`, whose state goes into checkpoints so that a
resumed run sees the same prompts as an uninterrupted one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

logger = logging.getLogger("hydrappo")

# File extension -> `datasets` packaged builder.
BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text"}


class DataError(ValueError):
    """Prompt data is unusable; the message says what is wrong and how to fix it."""


def _prompt_files(path: Path) -> list[Path]:
    if not path.exists():
        raise DataError(f"prompt path {str(path)!r} does not exist; set data.prompts to a prompt file or directory.")
    if path.is_file():
        if path.suffix.lower() not in BUILDERS:
            raise DataError(f"{path}: unsupported prompt file type {path.suffix!r}; use one of {', '.join(BUILDERS)}.")
        return [path]
    # Sorted so that the prompt order (and hence the sampler's indices) is the same on every run.
    files = sorted(
        f for f in path.rglob("*")
        if f.is_file() and f.suffix.lower() in BUILDERS and not any(p.startswith(".") for p in f.relative_to(path).parts)
    )
    if not files:
        raise DataError(f"directory {str(path)!r} holds no prompt files ({', '.join(BUILDERS)}).")
    return files


def _load_file(file: Path, column: str) -> list[str]:
    from datasets import load_dataset

    builder = BUILDERS[file.suffix.lower()]
    # The text builder yields one row per line in a column named "text".
    column = "text" if builder == "text" else column
    try:
        dataset = load_dataset(builder, data_files=str(file), split="train")
    except Exception as error:  # datasets raises many types for malformed files
        raise DataError(f"{file}: could not be read as {builder}: {error}") from error
    if column not in dataset.column_names:
        raise DataError(
            f"{file}: no column {column!r}; columns present: {', '.join(dataset.column_names) or '(none)'}. "
            "Set data.prompt_column to the column that holds the prompts."
        )
    texts = list(dataset[column])
    unit = "line" if builder == "text" else "row"
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise DataError(f"{file}: {unit} {i + 1} has a {type(text).__name__} prompt ({text!r}); prompts must be text.")
        if not text.strip():
            raise DataError(f"{file}: {unit} {i + 1} has an empty prompt; remove it.")
    return texts


def load_prompt_texts(path: str, column: str = "prompt") -> list[str]:
    """All prompts of a jsonl/json/csv/parquet/txt file, or of every such file in a
    directory (recursively, sorted by path). For .txt files each line is a prompt and
    `column` is ignored."""
    texts = []
    for file in _prompt_files(Path(path)):
        texts.extend(_load_file(file, column))
    if not texts:
        raise DataError(f"no prompts in {str(path)!r}: the data is empty.")
    return texts


def format_prompt(text: str, tokenizer, apply_chat_template: bool, system_prompt: str | None = None) -> str:
    """The text the model continues: `text` as a user turn of the tokenizer's chat
    template (after an optional system turn), or `text` unchanged."""
    if not apply_chat_template:
        return text
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(
            "data.apply_chat_template is set but the tokenizer has no chat template; "
            "turn apply_chat_template off or use a tokenizer with a chat_template."
        )
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": text})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


@dataclass
class PromptSet:
    texts: list[str]  # as loaded
    formatted: list[str]  # after the chat template (equal to texts without one)
    input_ids: list[list[int]]  # formatted and tokenized, at most max_prompt_length tokens

    def __len__(self) -> int:
        return len(self.input_ids)


def tokenize_prompts(
    texts: list[str],
    tokenizer,
    max_prompt_length: int,
    apply_chat_template: bool = False,
    system_prompt: str | None = None,
) -> PromptSet:
    """Format and tokenize prompts; longer ones keep their last `max_prompt_length`
    tokens (the end is what the model continues), with one warning for all of them."""
    if max_prompt_length < 1:
        raise DataError(f"data.max_prompt_length must be at least 1, not {max_prompt_length}.")
    if not texts:
        raise DataError("no prompts to tokenize.")
    formatted = [format_prompt(t, tokenizer, apply_chat_template, system_prompt) for t in texts]
    # A chat template already writes the special tokens (BOS etc.); adding them again
    # would give the model a prompt it never saw in training.
    encoded = tokenizer(formatted, add_special_tokens=not apply_chat_template)["input_ids"]
    input_ids, truncated = [], 0
    for i, ids in enumerate(encoded):
        if not ids:
            raise DataError(f"prompt {i} ({texts[i]!r}) tokenizes to no tokens; remove it.")
        if len(ids) > max_prompt_length:
            ids = ids[-max_prompt_length:]
            truncated += 1
        input_ids.append(list(ids))
    if truncated:
        logger.warning(
            "%d of %d prompts are longer than max_prompt_length=%d tokens and were truncated from the left to %d tokens.",
            truncated, len(texts), max_prompt_length, max_prompt_length,
        )
    return PromptSet(texts=list(texts), formatted=formatted, input_ids=input_ids)


def left_pad(rows: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded (input_ids, attention_mask), both LongTensor (B, longest row).

    The mask comes from the row lengths, never from comparing ids with pad_token_id:
    the pad token may be the EOS token (SmolLM2), which can also be a real token."""
    if not rows:
        raise ValueError("left_pad needs at least one row.")
    if pad_token_id is None:
        raise ValueError("left_pad needs a pad_token_id; set tokenizer.pad_token (e.g. to the EOS token).")
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if len(row):
            input_ids[i, width - len(row) :] = torch.as_tensor(row, dtype=torch.long)
            attention_mask[i, width - len(row) :] = 1
    return input_ids, attention_mask


class PromptSampler:
    """Prompt indices in epochs: each epoch is a permutation drawn from a generator
    seeded by (seed, epoch), so the order depends on nothing but those two numbers and
    a run resumed from `state_dict()` continues with exactly the same indices."""

    def __init__(self, num_prompts: int, seed: int = 0):
        if num_prompts < 1:
            raise DataError("PromptSampler needs at least one prompt.")
        if seed < 0:
            raise DataError(f"the data seed must be non-negative, not {seed}.")
        self.num_prompts = num_prompts
        self.seed = seed
        self.epoch = 0
        self.position = 0  # next index within this epoch's permutation
        self._order = None

    def _permutation(self) -> np.ndarray:
        if self._order is None:
            self._order = np.random.default_rng([self.seed, self.epoch]).permutation(self.num_prompts)
        return self._order

    def next_batch(self, n: int) -> list[int]:
        """The next `n` indices, continuing into the next epoch when this one runs out."""
        batch = []
        while len(batch) < n:
            if self.position == self.num_prompts:
                self.epoch, self.position, self._order = self.epoch + 1, 0, None
            take = min(n - len(batch), self.num_prompts - self.position)
            batch.extend(self._permutation()[self.position : self.position + take].tolist())
            self.position += take
        return batch

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if not 0 <= state["position"] <= self.num_prompts:
            raise DataError(
                f"sampler position {state['position']} does not fit {self.num_prompts} prompts: "
                "the prompt data changed since the checkpoint; resume with the same data."
            )
        # The checkpoint's seed wins: the order must be the one the run started with.
        self.seed, self.epoch, self.position = int(state["seed"]), int(state["epoch"]), int(state["position"])
        self._order = None
