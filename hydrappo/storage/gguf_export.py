"""A transformers model folder -> ONE .gguf file that llama.cpp (and Ollama) load: f32, f16 or q8_0.

The folder is what `hydrappo export CKPT` writes (a run's policy, LoRA merged): `export_gguf`, behind
`hydrappo export CKPT --out x.gguf` and tools/export_gguf.py, writes it into a hidden temporary folder beside
the file and then the file (`write_gguf`), after checking what it can before writing anything (the type, the
family, the tokenizer, an existing --out). The file is written with
the `gguf` package (gguf-py, llama.cpp's own writer); the metadata keys, the tensor names and the two
layout changes follow llama.cpp's convert_hf_to_gguf.py for the families the project trains:

* Llama-style (SmolLM2, arch `llama`): llama.cpp applies rotary embeddings to interleaved pairs, Hugging
  Face to the two halves of each head, so q_proj and k_proj rows are permuted per head (`_permute_rows`;
  transformers' GGUF reader undoes it).
* Gemma 3 (arch `gemma3`): Hugging Face's RMSNorm multiplies by (1 + weight), llama.cpp by weight, so
  every `*norm.weight` is written + 1. llama.cpp fixes Gemma 3's other traits itself (the sqrt(hidden)
  embedding scale, one full-attention layer in six, a local rope base of 10000).

Types as llama.cpp's converter writes them: norms and other 1-D tensors stay f32; f16 rounds 2-D weights
to half; q8_0 stores blocks of 32 values as one f16 scale max|x|/127 and 32 int8 (a weight whose row is
not a multiple of 32 falls back to f16). The tokenizer goes in as llama.cpp reads it: a byte-level BPE
(SmolLM2, GPT-2 style) as `gpt2` with its merges; a SentencePiece-style BPE with byte fallback (Gemma,
Llama 2) as `llama` with scores; the special-token ids, add-BOS flag and chat template from the folder.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import UsageError

GGUF_TYPES = ("f16", "q8_0", "f32")
SUPPORTED = {"llama": "llama", "mistral": "llama", "gemma3_text": "gemma3", "gemma3": "gemma3"}
Q8_BLOCK = 32


class GGUFExportError(UsageError):
    """A folder that cannot be written as GGUF (missing, another architecture, a bad type)."""


@dataclass(frozen=True)
class GGUFExport:
    path: Path
    arch: str
    gguf_type: str
    tensors: int


def _permute_rows(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Hugging Face's rotary halves -> llama.cpp's interleaved pairs, per head (the inverse of
    transformers' GGUF reader `_reverse_permute_weights`)."""
    rows = weight.shape[0] // n_head // 2
    return weight.reshape(n_head, 2, rows, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _rope_theta(config, kind: str = "full_attention") -> float:
    """rope_theta of a transformers 4 or 5 config (5 keeps it in rope_parameters, per layer kind for Gemma 3)."""
    params = getattr(config, "rope_parameters", None) or {}
    if kind in params and isinstance(params[kind], dict):
        params = params[kind]
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    return float(theta if theta is not None else 10000.0)


def _check_rope(config) -> None:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    kinds = [params] if "rope_type" in params else [v for v in params.values() if isinstance(v, dict)]
    for item in kinds:
        if item.get("rope_type", "default") not in ("default", "linear"):
            raise GGUFExportError(
                f"rope_type {item['rope_type']!r} is not written to GGUF here (default and linear are); "
                "use llama.cpp's convert_hf_to_gguf.py for this model."
            )


def _add_hparams(writer, config, arch: str) -> None:
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(getattr(config, "num_key_value_heads", None) or heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(_rope_theta(config))
    writer.add_vocab_size(config.vocab_size)
    if arch == "llama":
        writer.add_rope_dimension_count(head_dim)
    else:
        writer.add_sliding_window(config.sliding_window)
        if getattr(config, "final_logit_softcapping", None):
            writer.add_final_logit_softcapping(config.final_logit_softcapping)
    params = getattr(config, "rope_parameters", None) or {}
    full = params.get("full_attention", params) if isinstance(params, dict) else {}
    if full.get("rope_type") == "linear":
        import gguf

        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(full["factor"])


def _tensor_type(array: np.ndarray, gguf_type: str):
    import gguf

    T = gguf.GGMLQuantizationType
    if array.ndim < 2 or gguf_type == "f32":
        return T.F32
    if gguf_type == "q8_0" and array.shape[-1] % Q8_BLOCK == 0:
        return T.Q8_0
    return T.F16


def _encode(array: np.ndarray, qtype):
    import gguf

    T = gguf.GGMLQuantizationType
    if qtype == T.F32:
        return array.astype(np.float32), None
    if qtype == T.F16:
        return array.astype(np.float16), None
    return gguf.quants.quantize(array.astype(np.float32), qtype), qtype


def _weights(model, config, arch: str):
    """(gguf name, float32 array) of every tensor llama.cpp reads, in the model's order."""
    import gguf

    arch_enum = {"llama": gguf.MODEL_ARCH.LLAMA, "gemma3": gguf.MODEL_ARCH.GEMMA3}[arch]
    names = gguf.TensorNameMap(arch_enum, config.num_hidden_layers)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    for name, tensor in model.state_dict().items():
        if name.endswith("rotary_emb.inv_freq") or (tied and name == "lm_head.weight"):
            continue
        target = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if target is None:
            raise GGUFExportError(f"tensor {name!r} has no GGUF name for arch {arch!r}; this model cannot be written.")
        array = tensor.detach().float().cpu().numpy()
        if arch == "llama" and name.endswith("q_proj.weight"):
            array = _permute_rows(array, heads)
        elif arch == "llama" and name.endswith("k_proj.weight"):
            array = _permute_rows(array, kv_heads)
        elif arch == "gemma3" and name.endswith("norm.weight"):
            array = array + 1.0
        yield target, array


# ---------------------------------------------------------------------------- the tokenizer


def _tokenizer_json(folder: Path) -> dict:
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise GGUFExportError(
            f"{str(folder)!r} has no tokenizer.json: GGUF holds the tokenizer, so the folder needs its fast "
            "tokenizer (hydrappo export writes it)."
        )
    return json.loads(path.read_text(encoding="utf-8"))


def check_tokenizer(folder: Path) -> dict:
    """The folder's tokenizer.json, or GGUFExportError when GGUF export cannot write its kind."""
    data = _tokenizer_json(folder)
    kind = data.get("model", {}).get("type")
    if kind != "BPE":
        raise GGUFExportError(
            f"the tokenizer in {str(folder)!r} is a {kind!r} model; GGUF export writes BPE tokenizers "
            "(byte-level like SmolLM2's, or SentencePiece-style like Gemma's)."
        )
    return data


def prepends_space(tokenizer_json: dict) -> bool:
    """Whether a SentencePiece-style tokenizer.json puts "▁" before a text's first word: Llama 2's does (a
    `Prepend` normalizer, or a `Metaspace` pre-tokenizer that prepends), Gemma's does not (it only replaces
    spaces). llama.cpp's SentencePiece tokenizer prepends unless the file says otherwise
    (tokenizer.ggml.add_space_prefix), which would turn "The" into "▁The" and change every prompt."""

    def parts(component, key):
        if not component:
            return []
        if component.get("type") == "Sequence":
            return [part for child in component.get(key, []) for part in parts(child, key)]
        return [component]

    for normalizer in parts(tokenizer_json.get("normalizer"), "normalizers"):
        if normalizer.get("type") == "Prepend" and normalizer.get("prepend") == "▁":
            return True
    for pre in parts(tokenizer_json.get("pre_tokenizer"), "pretokenizers"):
        if pre.get("type") == "Metaspace":
            scheme = pre.get("prepend_scheme", "always" if pre.get("add_prefix_space", True) else "never")
            if scheme in ("always", "first"):
                return True
    return False


def _add_tokenizer(writer, folder: Path, vocab_size: int) -> None:
    import gguf

    data = check_tokenizer(folder)
    model = data["model"]
    added = {item["id"]: item for item in data.get("added_tokens", [])}
    vocab = dict(model["vocab"])
    vocab.update({item["content"]: i for i, item in added.items()})
    by_id = {i: token for token, i in vocab.items()}
    sentencepiece = bool(model.get("byte_fallback"))
    tokens, types, scores = [], [], []
    T = gguf.TokenType
    for i in range(max(vocab_size, len(by_id))):
        token = by_id.get(i)
        if token is None:
            tokens.append(f"[PAD{i}]")
            types.append(T.UNUSED)
        else:
            tokens.append(token)
            if i in added:
                types.append(T.CONTROL if added[i].get("special") else T.USER_DEFINED)
            elif sentencepiece and len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
                types.append(T.BYTE)
            else:
                types.append(T.NORMAL)
        # SentencePiece BPE merges by score; a vocabulary built from merges lists earlier merges first
        scores.append(-float(i))
    writer.add_tokenizer_model("llama" if sentencepiece else "gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    if sentencepiece:
        writer.add_token_scores(scores)
        writer.add_add_space_prefix(prepends_space(data))
    special = gguf.SpecialVocab(folder, load_merges=not sentencepiece, n_vocab=len(tokens))
    special.add_to_gguf(writer, quiet=True)


# ---------------------------------------------------------------------------- the file


def gguf_arch(config) -> str:
    """The GGUF architecture a transformers config is written as, or GGUFExportError naming the families that are."""
    arch = SUPPORTED.get(config.model_type)
    if arch is None:
        raise GGUFExportError(
            f"GGUF export writes the Llama-style (model_type {', '.join(repr(t) for t in SUPPORTED if 'gemma' not in t)})"
            f" and Gemma 3 (model_type 'gemma3_text', 'gemma3') families; this model is {config.model_type!r}. "
            "Export it to a folder (`hydrappo export CHECKPOINT --out DIR`) and convert that with llama.cpp's "
            "convert_hf_to_gguf.py."
        )
    return arch


def check_gguf_out(path: str | os.PathLike, gguf_type: str) -> Path:
    path = Path(path).expanduser()
    if path.suffix.lower() != ".gguf":
        raise GGUFExportError(f"GGUF output {str(path)!r} must end in .gguf.")
    if gguf_type not in GGUF_TYPES:
        raise GGUFExportError(f"--gguf_type {gguf_type!r} is not one of {', '.join(GGUF_TYPES)}.")
    return path


def write_gguf(
    folder: str | os.PathLike, out: str | os.PathLike, gguf_type: str = "f16", name: str | None = None
) -> GGUFExport:
    """Write the transformers model folder `folder` as the GGUF file `out` (f16, q8_0 or f32); `name`
    (default: the folder's) is the file's general.name. The file appears at `out` only when complete: it
    is written to a hidden sibling (storage/atomic.py's temporary name, removed on failure, and by the next
    writer if this process is killed) and renamed."""
    import gguf
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from .atomic import remove_orphaned_temporaries, temporary_prefix

    out = check_gguf_out(out, gguf_type).absolute()
    folder = Path(folder).expanduser()
    if not (folder / "config.json").is_file():
        raise GGUFExportError(
            f"{str(folder)!r} is not a transformers model folder (no config.json); "
            "write one with `hydrappo export CKPT --out DIR` first, or give a checkpoint."
        )
    config = AutoConfig.from_pretrained(folder)
    arch = gguf_arch(config)
    if config.model_type == "gemma3":  # a multimodal folder: the text model is what GGUF `gemma3` holds
        config = config.text_config
    _check_rope(config)
    check_tokenizer(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    file_type = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16}
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_orphaned_temporaries(out.parent)
    writer_path = out.with_name(temporary_prefix(out.name) + "file")
    writer = gguf.GGUFWriter(writer_path, arch)
    writer.add_name(name or folder.name)
    writer.add_file_type(file_type.get(gguf_type, gguf.LlamaFileType.MOSTLY_Q8_0))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _add_hparams(writer, config, arch)
    _add_tokenizer(writer, folder, config.vocab_size)
    count = 0
    for tensor_name, array in _weights(model, config, arch):
        data, raw = _encode(array, _tensor_type(array, gguf_type))
        writer.add_tensor(tensor_name, data, raw_dtype=raw)
        count += 1
    del model
    try:
        try:
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()
        os.replace(writer_path, out)
    finally:
        writer_path.unlink(missing_ok=True)
    return GGUFExport(out, arch, gguf_type, count)


# ---------------------------------------------------------------------------- a checkpoint or a folder -> .gguf


def gguf_source(source: str | os.PathLike) -> tuple[str, Path]:
    """("folder", path) for a transformers model folder, ("checkpoint", folder) for a hydrappo checkpoint or
    a run's output_dir (its newest checkpoint: a run's folder that also holds a model, as the SFT stage writes
    it, counts as a run)."""
    from .checkpoint import find_checkpoint, is_checkpoint_folder, latest_checkpoint

    path = Path(source).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        raise GGUFExportError(
            f"{str(path)!r} is already a GGUF file. `hydrappo export from-gguf {path} --out DIR` converts it to a "
            "safetensors folder; `hydrappo export` writes GGUF from a checkpoint or a transformers folder."
        )
    if (
        path.is_dir()
        and (path / "config.json").is_file()
        and not is_checkpoint_folder(path)
        and latest_checkpoint(path) is None
    ):
        return "folder", path
    return "checkpoint", find_checkpoint(path, for_resume=False)


def _checkpoint_base(checkpoint: Path, base_model: str | None, tokenizer: str | None):
    """(the base model's config, the tokenizer's local folder or None) of a checkpoint, read without building
    the model; (None, None) when they cannot be found here: the export itself then says why."""
    from ..config import Config
    from .checkpoint import load_checkpoint_config
    from .export import _resolve_location
    from .models import resolve_model_source, source_config

    try:
        model = load_checkpoint_config(checkpoint, Config).model
        name = base_model or _resolve_location(model.name_or_path, checkpoint, "the base model")
        directory, gguf_file = resolve_model_source(name, None if base_model else model.gguf_file, option=None)
        config = source_config(directory, gguf_file)
    except (UsageError, OSError, ValueError):
        return None, None
    words = tokenizer or model.tokenizer_name_or_path
    folder = Path(words).expanduser() if words else (directory if gguf_file is None else None)
    return config, folder if folder is not None and (folder / "tokenizer.json").is_file() else None


def export_gguf(
    source: str | os.PathLike,
    out: str | os.PathLike,
    gguf_type: str = "f16",
    *,
    overwrite: bool = False,
    base_model: str | None = None,
    tokenizer: str | None = None,
    device: str = "cpu",
    value_head: str | os.PathLike | None = None,
    reward_branch: str | os.PathLike | None = None,
) -> GGUFExport:
    """A checkpoint's trained policy (LoRA merged), or a transformers model folder, as the one GGUF file `out`.

    What can be checked cheaply is checked before anything is written: the type, the model family and the
    tokenizer, and `out` by the rule of every export (storage/rundir.claim_output_path: an existing file is
    refused without `overwrite`, moved to a sibling NAME.previous-<time> with it, never deleted). A
    checkpoint is exported (storage/export.py) into a hidden temporary folder beside `out`, which goes
    when the file is written; `value_head` and `reward_branch` are that export's."""
    import shutil
    import tempfile

    from .atomic import remove_orphaned_temporaries, temporary_prefix
    from .rundir import claim_output_path

    out = check_gguf_out(out, gguf_type)
    kind, path = gguf_source(source)
    if kind == "folder":
        from transformers import AutoConfig

        if base_model or tokenizer or value_head or reward_branch:
            raise GGUFExportError(
                f"{str(path)!r} is a transformers model folder: --base-model, --tokenizer, --value-head and "
                "--reward-branch belong to a checkpoint's export; leave them out."
            )
        gguf_arch(AutoConfig.from_pretrained(path))
        check_tokenizer(path)
        config = None
    else:
        config, tokenizer_folder = _checkpoint_base(path, base_model, tokenizer)
        if config is not None:
            gguf_arch(config)
        if tokenizer_folder is not None:
            check_tokenizer(tokenizer_folder)
    inputs = {"the checkpoint" if kind == "checkpoint" else "the model folder": path, "--base-model": base_model}
    inputs["--tokenizer"] = tokenizer
    out = claim_output_path(out, overwrite=overwrite, option="--out", folder=False, inputs=inputs)
    for option, extra in (("--value-head", value_head), ("--reward-branch", reward_branch)):
        claim_output_path(extra, overwrite=overwrite, option=option, folder=False, inputs=inputs)
    if kind == "folder":
        return write_gguf(path, out, gguf_type)
    from .export import export_checkpoint

    out.parent.mkdir(parents=True, exist_ok=True)
    remove_orphaned_temporaries(out.parent)
    work = Path(tempfile.mkdtemp(prefix=temporary_prefix(out.name), dir=out.parent))
    try:
        folder = export_checkpoint(
            path,
            work / "model",
            base_model=base_model,
            tokenizer=tokenizer,
            value_head=value_head,
            reward_branch=reward_branch,
            device=device,
        )
        return write_gguf(folder, out, gguf_type, name=out.stem)
    finally:
        shutil.rmtree(work, ignore_errors=True)
