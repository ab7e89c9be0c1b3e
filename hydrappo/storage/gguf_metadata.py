"""A GGUF file's metadata read without its tensors, and the chat template of the tokenizer a config
names, read before any weight loads or any GGUF file is converted (storage/models.py converts).

A base model (Gemma 3 270M, say) has no chat template: a run that needs one (data.apply_chat_template,
message-list prompts, multi-turn episodes) is refused at once, not after a conversion of a minute.
The `gguf` package's GGUFReader parses every value of the file, the ~260k token strings of a large
vocabulary included (tens of seconds); the keys wanted here are read by skipping over the rest.

The format (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md): b"GGUF", a uint32 version,
a uint64 tensor count and a uint64 key-value count, then the key-value pairs: the key as a string
(uint64 length, UTF-8 bytes), a uint32 value type, the value; an array value is a uint32 item type,
a uint64 count and the items. All little-endian.
"""

from __future__ import annotations

import struct
from pathlib import Path

from .hub import ModelLoadError

# GGUF value type -> struct format of one value (8: string, 9: array, read apart)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def gguf_metadata(path: str | Path, keys: tuple[str, ...]) -> dict:
    """{key: value} of the `keys` the GGUF file at `path` holds (scalars and strings; an array's
    value is skipped and read as None). Stops reading once every key is found."""
    path, wanted, found = Path(path), set(keys), {}
    with open(path, "rb") as handle:

        def read(fmt: str):
            size = struct.calcsize(fmt)
            data = handle.read(size)
            if len(data) != size:
                raise ModelLoadError(f"{path}: the GGUF file ends inside its metadata (cut short?).")
            return struct.unpack(fmt, data)[0]

        def skip_string() -> None:
            handle.seek(read("<Q"), 1)

        def value(kind: int, keep: bool):
            if kind in _SCALARS:
                return read(_SCALARS[kind])
            if kind == _STRING:
                if keep:
                    return handle.read(read("<Q")).decode("utf-8", errors="replace")
                return skip_string()
            if kind == _ARRAY:
                item, count = read("<I"), read("<Q")
                if item in _SCALARS:
                    handle.seek(count * struct.calcsize(_SCALARS[item]), 1)
                else:
                    for _ in range(count):
                        value(item, keep=False)
                return None
            raise ModelLoadError(f"{path}: unknown GGUF value type {kind} in its metadata (a newer GGUF version?).")

        if handle.read(4) != b"GGUF":
            raise ModelLoadError(f"{path} is not a GGUF file (it does not start with b'GGUF').")
        read("<I")  # version
        read("<Q")  # tensor count
        for _ in range(read("<Q")):
            key = handle.read(read("<Q")).decode("utf-8", errors="replace")
            kept = value(read("<I"), keep=key in wanted)
            if key in wanted:
                found[key] = kept
                if len(found) == len(wanted):
                    break
    return found


def gguf_chat_template(path: str | Path) -> str | None:
    """The chat template a GGUF file carries (its metadata key tokenizer.chat_template), or None."""
    return gguf_metadata(path, ("tokenizer.chat_template",)).get("tokenizer.chat_template") or None


def source_chat_template(model_config) -> str | None:
    """The chat template of the tokenizer `model_config` names (model.tokenizer_name_or_path, else the
    model's own), read without loading weights: a GGUF file's metadata, a folder's tokenizer files.
    None when it has none."""
    from .models import load_tokenizer, local_source, resolve_model_source

    if model_config.tokenizer_name_or_path:
        name, gguf_file, revision = model_config.tokenizer_name_or_path, None, None
        option = "model.tokenizer_name_or_path"
    else:
        name, gguf_file, revision = model_config.name_or_path, model_config.gguf_file, model_config.revision
        option = "model.name_or_path"
    path = local_source(name, revision, gguf_file, option=option)
    tokenizer_only = path.is_dir() and gguf_file is None and not (path / "config.json").is_file()
    if not (tokenizer_only and not any(path.glob("*.gguf"))):
        directory, gguf = resolve_model_source(name, gguf_file, revision, option=option)
        if gguf is not None:
            return gguf_chat_template(directory / gguf)
        path = directory
    return getattr(load_tokenizer(path, option=option), "chat_template", None) or None
