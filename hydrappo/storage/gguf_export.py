"""A transformers model folder -> ONE .gguf file that llama.cpp (and Ollama) load: f32, f16 or q8_0.

The folder is what `hydrappo export CKPT` writes (a run's policy, LoRA merged). The file is written with
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


def _add_tokenizer(writer, folder: Path, vocab_size: int) -> None:
    import gguf

    data = _tokenizer_json(folder)
    model = data.get("model", {})
    if model.get("type") != "BPE":
        raise GGUFExportError(
            f"the tokenizer is a {model.get('type')!r} model; GGUF export writes BPE tokenizers "
            "(byte-level like SmolLM2's, or SentencePiece-style like Gemma's)."
        )
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
    special = gguf.SpecialVocab(folder, load_merges=not sentencepiece, n_vocab=len(tokens))
    special.add_to_gguf(writer, quiet=True)


# ---------------------------------------------------------------------------- the file


def check_gguf_out(path: str | os.PathLike, gguf_type: str) -> Path:
    path = Path(path).expanduser()
    if path.suffix.lower() != ".gguf":
        raise GGUFExportError(f"GGUF output {str(path)!r} must end in .gguf.")
    if gguf_type not in GGUF_TYPES:
        raise GGUFExportError(f"--gguf_type {gguf_type!r} is not one of {', '.join(GGUF_TYPES)}.")
    return path


def write_gguf(folder: str | os.PathLike, out: str | os.PathLike, gguf_type: str = "f16") -> GGUFExport:
    """Write the transformers model folder `folder` as the GGUF file `out` (f16, q8_0 or f32).
    The file appears at `out` only when complete (written beside it, then renamed)."""
    import gguf
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out = check_gguf_out(out, gguf_type)
    folder = Path(folder).expanduser()
    if not (folder / "config.json").is_file():
        raise GGUFExportError(
            f"{str(folder)!r} is not a transformers model folder (no config.json); "
            "write one with `hydrappo export CKPT --out DIR` first, or give a checkpoint."
        )
    config = AutoConfig.from_pretrained(folder)
    arch = SUPPORTED.get(config.model_type)
    if arch is None:
        raise GGUFExportError(
            f"model_type {config.model_type!r} is not written to GGUF here (Llama-style and Gemma 3 are); "
            "use llama.cpp's convert_hf_to_gguf.py for it."
        )
    if config.model_type == "gemma3":  # a multimodal folder: the text model is what GGUF `gemma3` holds
        config = config.text_config
    _check_rope(config)
    _tokenizer_json(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    file_type = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16}
    writer_path = out.with_name(out.name + ".partial")
    writer = gguf.GGUFWriter(writer_path, arch)
    writer.add_name(folder.name)
    writer.add_file_type(file_type.get(gguf_type, gguf.LlamaFileType.MOSTLY_Q8_0))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _add_hparams(writer, config, arch)
    _add_tokenizer(writer, folder, config.vocab_size)
    count = 0
    for name, array in _weights(model, config, arch):
        data, raw = _encode(array, _tensor_type(array, gguf_type))
        writer.add_tensor(name, data, raw_dtype=raw)
        count += 1
    del model
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    os.replace(writer_path, out)
    return GGUFExport(out, arch, gguf_type, count)
