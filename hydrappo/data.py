"""Data: ONE table reader for prompts, preference pairs and SFT rows; padding and the
resumable prompt order (prompts.py formats and tokenizes prompts; preferences.py reads TRL's
preference formats with this reader).

`read_table` reads a column table from any of
  * a local file (.jsonl/.json/.csv/.parquet, and .txt for prompts: one per line);
  * a local directory of such files (every file, recursively, in sorted order);
  * a folder written by `datasets`' `save_to_disk`, or laid out as on the Hugging Face Hub
    (files named by split, e.g. data/train-00000-of-00001.parquet, or a README with configs),
    read with its `split` and `subset`;
  * a `datasets` name, loaded with `datasets.load_dataset(name, subset, split=split)` (from the
    local datasets cache when there is no network), or, where datasets cannot, a dataset repo of that
    name in the Hub cache (HF_HUB_CACHE), as `hf download --repo-type dataset` leaves it.
Every file is read with `datasets`. The order of prompts for training comes from
`PromptSampler`, whose state goes into checkpoints so that a resumed run sees the same
prompts as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from pathlib import Path

import numpy as np
import torch

from .config import looks_like_a_path
from .errors import DataError
from .prompts import PromptSet, conversation_column, format_prompt, tokenize_prompts  # noqa: F401 (also this module's API)

logger = logging.getLogger("hydrappo")

# File extension -> `datasets` packaged builder.
BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text"}


# --------------------------------------------------------------------------- reading tables
def _is_saved_dataset(path: Path) -> bool:
    """A folder written by Dataset.save_to_disk / DatasetDict.save_to_disk."""
    return (path / "dataset_dict.json").is_file() or (
        (path / "state.json").is_file() and (path / "dataset_info.json").is_file()
    )


def _is_hub_layout(path: Path) -> bool:
    """A folder whose files are named by split (or whose README declares configs), as on the Hub."""
    from datasets.data_files import get_data_patterns

    readme = path / "README.md"
    if readme.is_file() and re.search(r"^---\n(.*\n)*?configs:", readme.read_text(errors="replace"), re.MULTILINE):
        return True
    try:
        patterns = get_data_patterns(str(path))
    except Exception:  # datasets raises EmptyDatasetError and others for folders it cannot use
        return False
    return any(pattern != ["**"] for pattern in patterns.values())


def _data_files(path: Path, setting: str, allow_text: bool) -> list[Path]:
    kinds = [ext for ext, builder in BUILDERS.items() if allow_text or builder != "text"]
    what = "prompt" if allow_text else "data"
    if path.is_file():
        if path.suffix.lower() not in kinds:
            raise DataError(
                f"{setting}: {path}: unsupported {what} file type {path.suffix!r}; use one of {', '.join(kinds)}."
            )
        return [path]
    # Sorted, so that the row order (and hence the sampler's indices and the eval split) is stable.
    files = sorted(
        f
        for f in path.rglob("*")
        if f.is_file() and f.suffix.lower() in kinds and not any(p.startswith(".") for p in f.relative_to(path).parts)
    )
    if not files:
        raise DataError(f"{setting}: directory {str(path)!r} holds no {what} files ({', '.join(kinds)}).")
    return files


# The longest line a text data file may hold. datasets parses a line (a .jsonl row, a .csv row, a
# .json file written on one line) whole, in memory, at several times its size: a line of hundreds
# of MB gets the process killed by the OS instead of an error. A row of text a model reads is far
# shorter (a million tokens are a few MB).
MAX_LINE_BYTES = 64 << 20
_BLOCK = 1 << 20  # bytes read at a time


def _check_text(file: Path, setting: str) -> None:
    """Text formats must be UTF-8 and hold no line over MAX_LINE_BYTES: say where they do not,
    reading in blocks, before pyarrow fails deep inside or the OS kills the process."""
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")()
    line, offset, carried = 1, 0, 0  # carried: the bytes of the current line read so far
    with open(file, "rb") as handle:
        for block in iter(lambda: handle.read(_BLOCK), b""):
            try:
                decoder.decode(block)
            except UnicodeDecodeError as error:
                bad = block[error.start]
                line += block[: error.start].count(b"\n")
                raise DataError(
                    f"{setting}: {file}: not UTF-8 text: byte 0x{bad:02x} at line {line} (byte {offset + error.start}). Save the "
                    "file as UTF-8 (e.g. `iconv -f latin1 -t utf-8 FILE > NEW`)."
                ) from None
            pieces = [len(piece) for piece in block.split(b"\n")]  # the last one may go on in the next block
            pieces[0] += carried  # the line that earlier blocks began
            for number, size in enumerate(pieces, start=line):
                if size > MAX_LINE_BYTES:
                    ends_here = number < line + len(pieces) - 1
                    raise _line_too_long(file, setting, number, size if ends_here else _rest_of_line(handle, size))
            line, carried = line + len(pieces) - 1, pieces[-1]
            offset += len(block)
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            raise DataError(
                f"{setting}: {file}: not UTF-8 text: it ends inside a character (cut short?). Save it as UTF-8."
            ) from None


def _rest_of_line(handle, size: int) -> int:
    """The size of a line `size` bytes of which are read, reading on to its end in blocks."""
    for block in iter(lambda: handle.read(_BLOCK), b""):
        end = block.find(b"\n")
        if end >= 0:
            return size + end
        size += len(block)
    return size


def _line_too_long(file: Path, setting: str, number: int, size: int) -> DataError:
    mb = f"{size / 2**20:.1f} MB"
    if file.suffix.lower() == ".json":
        fix = (
            "A .json file written on one line is parsed whole: write its rows as .jsonl, one JSON object per line "
            f"(e.g. `jq -c '.[]' {file.name} > {file.stem}.jsonl`), and point {setting} at that file"
        )
    else:
        fix = "A row is one line here, and no text a model reads is that long: split or shorten that row"
    return DataError(
        f"{setting}: {file}: line {number} is {mb} long ({size} bytes), past the {MAX_LINE_BYTES >> 20} MB that "
        f"one line may hold (a longer one is read whole into memory, at several times its size). {fix}."
    )


def _empty(file: Path, setting: str, column: str) -> DataError:
    return DataError(
        f"{setting}: {file} is empty: it holds no rows. Fill it (e.g. one JSON object per line with a "
        f"{column!r} field for .jsonl, one text per line for .txt), or point {setting} at another file."
    )


def _unique_keys(pairs: list) -> dict:
    """json's object_pairs_hook: KeyError for a key given twice in one object (json keeps the last, pyarrow fails)."""
    keys = [key for key, _ in pairs]
    if len(set(keys)) < len(keys):
        raise KeyError(next(key for key in keys if keys.count(key) > 1))
    return dict(pairs)


def _check_rows(file: Path, setting: str, column: str) -> None:
    """Name an empty file, or a .jsonl line that is no object, gives a key twice or holds a lone
    surrogate, before datasets fails on it."""
    with open(file, "rb") as handle:  # in blocks: the file may be large
        if not any(block.strip() for block in iter(lambda: handle.read(_BLOCK), b"")):
            raise _empty(file, setting, column)
    if file.suffix.lower() != ".jsonl":
        return
    with open(file, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            try:
                row = json.loads(line, object_pairs_hook=_unique_keys) if line.strip() else {}
            except KeyError as error:
                raise DataError(
                    f"{setting}: {file}: line {number} gives the key {error.args[0]!r} twice; a JSON object "
                    "holds each key once: keep one of them."
                ) from None
            except ValueError as error:
                raise DataError(
                    f"{setting}: {file}: line {number} is not one JSON object ({getattr(error, 'msg', error)} "
                    f"at column {getattr(error, 'colno', '?')}); a .jsonl file holds one per line: fix it."
                ) from None
            if not isinstance(row, dict):
                raise DataError(
                    f"{setting}: {file}: line {number} holds a JSON {type(row).__name__}, not an object "
                    f'({{"{column}": ...}}); a .jsonl file holds one JSON object per line.'
                )
            if bad := re.search("[\ud800-\udfff]", json.dumps(row, ensure_ascii=False)):  # pyarrow: "Trailing data"
                raise DataError(
                    f"{setting}: {file}: line {number} holds a lone surrogate \\u{ord(bad.group()):04x} (half a UTF-16 "
                    "pair, not Unicode: text cut inside an emoji?); fix the text on that line (or write \\ufffd)."
                )


def _root_cause(error: BaseException) -> BaseException:
    seen = set()
    while (error.__cause__ or error.__context__) is not None and id(error) not in seen:
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return error


def _load_datasets(source: str, split: str, subset: str | None, setting: str) -> list[tuple[str, object]]:
    """[(where, datasets.Dataset)] of a table source, as the module docstring lists them."""
    import datasets

    path = Path(source).expanduser()
    if path.is_dir() and _is_saved_dataset(path):
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise DataError(f"{setting}: {path} has no split {split!r}; splits: {', '.join(loaded)}.")
            loaded = loaded[split]
        return [(str(path), loaded)]
    if path.exists() and not (path.is_dir() and _is_hub_layout(path)):
        return None
    if not path.exists() and looks_like_a_path(source):
        raise DataError(f"{setting}: {source!r} does not exist.")
    where = str(path) if path.exists() else source
    try:
        return [(where, datasets.load_dataset(str(path) if path.exists() else source, subset, split=split))]
    except ValueError as error:  # an unknown split or subset
        raise DataError(f"{setting}: {where}: {error}") from None
    except Exception as error:  # datasets raises many types when a name cannot be found or fetched
        snapshot = None if path.exists() else _cached_hub_dataset(source)
        if snapshot is not None:  # downloaded to the Hub cache (hf download --repo-type dataset): read it there
            try:
                return [(f"{source} ({snapshot})", datasets.load_dataset(str(snapshot), subset, split=split))]
            except ValueError as unknown:
                raise DataError(f"{setting}: {source} ({snapshot}): {unknown}") from None
        raise DataError(
            f"{setting}: {source!r} does not exist here as a file or folder, and datasets could not load it as a dataset name "
            f"(no network, and not in the local datasets cache?): {type(error).__name__}: {error}"
        ) from None


def _cached_hub_dataset(name: str) -> Path | None:
    """The folder of a dataset repo `name` ("org/name") in the Hub cache (HF_HUB_CACHE), as huggingface_hub
    downloaded it, or None. datasets' offline mode reads only its own cache of datasets it has loaded before;
    a repo fetched with `hf download --repo-type dataset` (or on another machine, then copied) sits here."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    from .storage.hub import hub_cache_dir

    if name.count("/") != 1:
        return None
    try:
        return Path(snapshot_download(name, repo_type="dataset", cache_dir=hub_cache_dir(), local_files_only=True))
    except (HFValidationError, LocalEntryNotFoundError, OSError, ValueError):  # not a repo id, or not cached
        return None


def read_table(
    source: str | Path,
    columns: list[str],
    optional: list[str] = (),
    *,
    setting: str = "data.train_file",
    split: str = "train",
    subset: str | None = None,
    allow_text: bool = False,
    nonempty: bool = False,
    others: bool = False,
    options: dict | None = None,
    conversations: bool = False,
) -> dict:
    """{column: list of values} of `source` (see the module docstring). `columns` must be
    present in every file and hold text (non-blank text with `nonempty`; the first may hold
    message lists with `conversations`, prompts.py); an `optional` column missing anywhere maps
    to None. With `allow_text`, .txt files count too: each line is a row of the first column.
    With `others`, every other column comes too, as it is (rows of a file without it hold
    None). `options` {column: the option that names it} go into the message of a missing column."""
    from datasets import load_dataset

    if not isinstance(source, (str, os.PathLike)):  # a table object (the Python API)
        loaded = [(f"the table given as {setting}", in_memory_dataset(source, setting, split))]
        source = f"<in-memory table of {len(loaded[0][1])} rows>"
    else:
        source = str(source)
        with _quiet("datasets"):
            loaded = _load_datasets(source, split, subset, setting)
    if loaded is None:
        path = Path(source).expanduser()
        loaded = []
        for file in _data_files(path, setting, allow_text):
            builder = BUILDERS[file.suffix.lower()]
            if builder != "parquet":
                _check_text(file, setting)
                _check_rows(file, setting, columns[0])
            try:
                with _quiet("datasets"):  # its builders log the error they then raise, with a traceback
                    dataset = load_dataset(builder, data_files=str(file), split="train")
            except Exception as error:  # datasets raises many types for malformed files
                cause = _root_cause(error)
                if "corresponds to no data" in str(cause):  # a header line alone, `[]`, a parquet file of no rows
                    raise _empty(file, setting, columns[0]) from None
                raise DataError(
                    f"{setting}: {file} could not be read as {builder}: {type(cause).__name__}: {str(cause)[:300]}. "
                    f"Check that it is valid {builder} ({'one JSON object per line' if file.suffix == '.jsonl' else 'see the datasets docs'})."
                ) from None
            if builder == "text":  # the text builder's one column is "text"
                dataset = dataset.rename_column("text", columns[0]) if columns[0] != "text" else dataset
            loaded.append((str(file), dataset))
    try:
        return _columns(loaded, source, columns, optional, setting, nonempty, others, options or {}, conversations)
    except DataError:
        raise
    except Exception as error:  # pyarrow and datasets raise many types while decoding columns
        cause = _root_cause(error)
        raise DataError(
            f"{setting}: {source!r} could not be read: {type(cause).__name__}: {str(cause)[:300]}."
        ) from None


@contextlib.contextmanager
def _quiet(logger_name: str):
    """Only critical records of `logger_name` (and its children) while the block runs, and no
    `datasets` progress bars: a table is read to be checked, and a bar printed before the error
    that says what is wrong with it only hides that error."""
    import datasets

    logger_, bars = logging.getLogger(logger_name), datasets.is_progress_bar_enabled()
    level = logger_.level
    logger_.setLevel(logging.CRITICAL)
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        logger_.setLevel(level)
        if bars:
            datasets.enable_progress_bars()


def in_memory_dataset(table, setting: str, split: str = "train"):
    """A `datasets.Dataset` of a table object: a Dataset, a DatasetDict (its `split`), a list
    of row dicts or a dict of columns."""
    from datasets import Dataset, DatasetDict

    if isinstance(table, DatasetDict):
        if split not in table:
            raise DataError(
                f"{setting}: the DatasetDict has no split {split!r} (splits: {', '.join(table)}); name one."
            )
        return table[split]
    if isinstance(table, Dataset):
        return table
    if isinstance(table, dict):
        return Dataset.from_dict(table)
    if isinstance(table, (list, tuple)) and all(isinstance(row, dict) for row in table):
        return Dataset.from_list(list(table))
    raise DataError(
        f"{setting}: a {type(table).__name__} is not a table; give a datasets.Dataset, a list of row dicts, a dict "
        "of columns, or a path (jsonl/json/csv/parquet/txt file, folder or datasets name)."
    )


def _columns(
    loaded,
    source: str,
    columns: list[str],
    optional,
    setting: str,
    nonempty: bool,
    others: bool = False,
    options: dict | None = None,
    conversations: bool = False,
) -> dict:
    table = {name: [] for name in (*columns, *optional)}
    extra: dict[str, list] = {}
    rows = 0
    for where, dataset in loaded:
        if others:
            for name in dataset.column_names:
                if name not in table and name not in extra:
                    extra[name] = [None] * rows
            for name, values in extra.items():
                values.extend(dataset[name] if name in dataset.column_names else [None] * len(dataset))
            rows += len(dataset)
        unit = "line" if where.endswith(".txt") else "row"
        missing = [c for c in columns if c not in dataset.column_names]
        if missing:
            named = [options[c] for c in missing if c in (options or {})]
            fix = f"set {' and '.join(named)} to the column that holds it" if named else "name the right column"
            inside = f": {where}" if where != source else ""
            raise DataError(
                f"{setting}={source}{inside} has no column {', '.join(map(repr, missing))}; columns present: "
                f"{', '.join(dataset.column_names) or '(none)'}. {fix[0].upper()}{fix[1:]}, or rename that column."
            )
        for name in columns:
            values = list(dataset[name])
            if conversations and name == columns[0] and any(isinstance(value, (list, tuple)) for value in values):
                values = conversation_column(values, where, unit, name)  # message lists (prompts.py)
            for row, value in enumerate(values if not (values and isinstance(values[0], list)) else ()):
                if not isinstance(value, str):
                    raise DataError(
                        f"{where}: {unit} {row + 1} has a {type(value).__name__} {name} ({value!r}); it must be text."
                    )
                if nonempty and not value.strip():
                    raise DataError(f"{where}: {unit} {row + 1} has an empty {name}; remove it.")
            table[name].extend(values)
        for name in optional:
            if table[name] is not None and name in dataset.column_names:
                table[name].extend(dataset[name])
            else:
                table[name] = None
    if not table[columns[0]]:
        raise DataError(f"{setting}: {source!r} holds no rows: the data is empty.")
    if len({isinstance(value, list) for value in table[columns[0]]}) > 1:  # files of text and files of message lists
        raise DataError(
            f"{setting}={source}: some files hold the {columns[0]} as text, others as message lists; give one kind."
        )
    table.update(extra)
    return table


def load_prompt_texts(
    path: str, column: str = "prompt", split: str = "train", subset: str | None = None, setting: str = "data.prompts"
) -> list[str]:
    """All prompts of `path` as texts (load_prompt_table without message lists or other columns);
    for .txt files each line is a prompt. `setting` names the option in errors."""
    return load_prompt_table(path, column, split, subset, setting, texts_only=True)[0]


def load_prompt_table(
    path: str,
    column: str = "prompt",
    split: str = "train",
    subset: str | None = None,
    setting: str = "data.prompts",
    option: str = "data.prompt_column",
    *,
    texts_only: bool = False,
) -> tuple[list, dict[str, list]]:
    """(prompts: texts or message lists, {other column: values, row-aligned}) of `path`: the
    other columns go to the reward functions as keyword arguments. `option` names the column.
    `texts_only`: text prompts only (see read_table's `conversations`) and no other columns."""
    table = read_table(
        path,
        [column],
        setting=setting,
        split=split,
        subset=subset,
        allow_text=True,
        nonempty=True,
        others=not texts_only,
        options={column: option},
        conversations=not texts_only,
    )
    texts = table.pop(column)
    return texts, table


# --------------------------------------------------------------------------- padding and the prompt order
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


def pack_sequences(
    prompt_ids: list[list[int]],
    response_ids: list[list[int]],
    pad_token_id: int,
    policy_mask: list[list[int]] | None = None,
):
    """Prompt left-padded to the widest prompt, response right-padded to the longest
    response. Returns input_ids, attention_mask, action_mask (float) and the prompt width.
    `policy_mask` (multi-turn episodes, Responses.policy_mask): the action mask is 0 on the tool
    turns' tokens, which stay in the attention mask (the policy reads them; they are not its actions)."""
    prompts, prompt_mask = left_pad(prompt_ids, pad_token_id)
    width = max(1, max(len(r) for r in response_ids))
    batch = len(response_ids)
    responses = torch.full((batch, width), pad_token_id, dtype=torch.long)
    action_mask = torch.zeros((batch, width), dtype=torch.float32)
    for row, tokens in enumerate(response_ids):
        responses[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        action_mask[row, : len(tokens)] = 1.0
    input_ids = torch.cat([prompts, responses], dim=1)
    attention_mask = torch.cat([prompt_mask, action_mask.long()], dim=1)
    if policy_mask is not None:
        for row, mask in enumerate(policy_mask):
            action_mask[row, : len(mask)] = torch.tensor(mask, dtype=torch.float32)
    return input_ids, attention_mask, action_mask, prompts.shape[1]


class PromptSampler:
    """Prompt indices in epochs: each epoch is a permutation drawn from a generator
    seeded by (seed, epoch), so the order depends on nothing but those two numbers and
    a run resumed from `state_dict()` continues with exactly the same indices."""

    def __init__(self, num_prompts: int, seed: int = 0):
        if num_prompts < 1:
            raise DataError("PromptSampler needs at least one prompt.")
        if seed < 0:
            raise DataError(f"the data seed must be non-negative, not {seed}.")
        self.num_prompts, self.seed = num_prompts, seed
        self.epoch, self.position, self._order = 0, 0, None  # position: the next index within this epoch's permutation

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


# --------------------------------------------------------------------------- pairs and SFT rows
def split_by_prompt(prompts: list[str], eval_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Row indices (train, eval): a seeded `eval_fraction` of the distinct prompts, with
    all their rows, is held out, so no held-out prompt is seen in training."""
    unique = sorted(set(prompts))
    if eval_fraction <= 0 or len(unique) < 2:
        return list(range(len(prompts))), []
    order = np.random.default_rng(seed).permutation(len(unique))
    held = {unique[i] for i in order[: max(1, round(eval_fraction * len(unique)))]}
    return [i for i, p in enumerate(prompts) if p not in held], [i for i, p in enumerate(prompts) if p in held]


def tokenize_responses(
    texts: list[str], tokenizer, max_length: int, append_eos: bool, add_special_tokens: bool = False
):
    """Token ids of each response, cut to `max_length`. With `append_eos` a response ends
    with EOS as a finished PPO response does, unless it was cut (a cut response did not end)."""
    encoded = tokenizer(list(texts), add_special_tokens=add_special_tokens)["input_ids"] if texts else []
    eos = [tokenizer.eos_token_id] if append_eos else []
    if append_eos and tokenizer.eos_token_id is None:
        raise DataError("append_eos is set but the tokenizer has no EOS token; set data.append_eos: false.")
    return [(list(ids) + eos)[:max_length] for ids in encoded]


def encode_prompts(texts: list[str], tokenizer, data) -> list[list[int]]:
    """Token ids of prompts, formatted and cut as the data options say."""
    return tokenize_prompts(
        texts, tokenizer, data.max_prompt_length, data.apply_chat_template, data.system_prompt
    ).input_ids


def read_sft_table(path, data, setting: str = "data.train_file", split: str | None = None) -> dict:
    """The prompt and response columns `SFTDataArgs` names, checked."""
    names = {data.prompt_column: "data.prompt_column", data.response_column: "data.response_column"}
    return read_table(
        path,
        [data.prompt_column, data.response_column],
        setting=setting,
        split=split or data.split,
        subset=data.subset,
        options=names,
    )


def load_sft_rows(
    path: str | Path,
    tokenizer,
    data,
    setting: str = "data.train_file",
    split: str | None = None,
    table: dict | None = None,
):
    """(prompt texts, prompt ids, response ids) of prompt/response rows (or of the `table` read_sft_table read)."""
    table = table if table is not None else read_sft_table(path, data, setting, split)
    prompts = table[data.prompt_column]
    response_ids = tokenize_responses(table[data.response_column], tokenizer, data.max_response_length, data.append_eos)
    return prompts, encode_prompts(prompts, tokenizer, data), response_ids
