"""A tiny Llama and a tiny Gemma 3 written to GGUF and read back with transformers' GGUF reader: the same
logits (f32 exactly; f16 within half-precision rounding), the same token ids, and q8_0 weights within
q8_0's blockwise rounding."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, Gemma3TextConfig, LlamaConfig, PreTrainedTokenizerFast

from hydrappo.storage.gguf_export import GGUFExportError, write_gguf

TEXTS = ["the quick brown fox", "hello world, a model in GGUF", "lazy dog jumps"]


def byte_bpe() -> PreTrainedTokenizerFast:
    """A byte-level BPE (SmolLM2's kind) trained in code on a few strings: 300 tokens."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<pad>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(TEXTS * 10, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def tiny_folder(family: str, path):
    tokenizer = byte_bpe()
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    if family == "llama":
        config = LlamaConfig(tie_word_embeddings=True, **common)
    else:  # llama.cpp scales Gemma 3's queries by 1/sqrt(head_dim): query_pre_attn_scalar = head_dim
        config = Gemma3TextConfig(head_dim=8, query_pre_attn_scalar=8, sliding_window=8, **common)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():  # norms off their initial value, so Gemma's +1 offset is seen
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.add_(0.1 * torch.randn_like(parameter))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model, tokenizer


def read_back(path, name, family):
    extra = {"query_pre_attn_scalar": 8} if family == "gemma3" else {}  # not a GGUF key: llama.cpp derives it
    return AutoModelForCausalLM.from_pretrained(path, gguf_file=name, dtype=torch.float32, **extra).eval()


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_gguf_round_trip(family, tmp_path):
    model, tokenizer = tiny_folder(family, tmp_path / "model")
    ids = tokenizer(TEXTS[0], return_tensors="pt").input_ids
    with torch.no_grad():
        reference = model(ids).logits
    for gguf_type in ("f32", "f16"):
        result = write_gguf(tmp_path / "model", tmp_path / f"{gguf_type}.gguf", gguf_type)
        assert result.arch == {"llama": "llama", "gemma3": "gemma3"}[family]
        with torch.no_grad():
            logits = read_back(tmp_path, f"{gguf_type}.gguf", family)(ids).logits
        if gguf_type == "f32":
            assert torch.equal(logits, reference)
        else:
            # f16 rounds each weight by <= 2**-11 relative; through 2 layers of 32-64 term sums of random
            # weights (logits ~1) that is ~1e-3; 1e-2 leaves room, a wrong layout is off by ~1e-1
            assert (logits - reference).abs().max() < 1e-2
    read_tokenizer = AutoTokenizer.from_pretrained(tmp_path, gguf_file="f32.gguf")
    for text in TEXTS:
        assert read_tokenizer(text).input_ids == tokenizer(text).input_ids


def test_q8_0_weights_within_block_rounding(tmp_path):
    import gguf

    tiny_folder("llama", tmp_path / "model")
    write_gguf(tmp_path / "model", tmp_path / "q8.gguf", "q8_0")
    f32 = write_gguf(tmp_path / "model", tmp_path / "f32.gguf", "f32")
    exact = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(tmp_path / "f32.gguf").tensors}
    reader = gguf.GGUFReader(tmp_path / "q8.gguf")
    assert len(reader.tensors) == f32.tensors == 2 * 9 + 2  # tied output: llama.cpp reads token_embd
    assert reader.fields["general.architecture"].contents() == "llama"
    assert reader.fields["tokenizer.ggml.model"].contents() == "gpt2"
    quantized = 0
    for tensor in reader.tensors:
        if tensor.tensor_type == gguf.GGMLQuantizationType.Q8_0:
            quantized += 1
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(exact[tensor.name].shape)
            blocks = exact[tensor.name].reshape(-1, 32)
            # a block's scale d = max|x|/127: rounding to an int8 step is <= d/2, and d stored in f16 is off by
            # <= d * 2**-11, times |q| <= 127
            bound = np.abs(blocks).max(axis=1, keepdims=True) / 127 * (0.5 + 127 * 2**-11)
            assert (np.abs(values.reshape(-1, 32) - blocks) <= bound + 1e-8).all()
    assert quantized == 2 * 7 + 1


def test_refuses_bad_input(tmp_path):
    with pytest.raises(GGUFExportError, match=r"\.gguf"):
        write_gguf(tmp_path, tmp_path / "model.bin")
    with pytest.raises(GGUFExportError, match="config.json"):
        write_gguf(tmp_path, tmp_path / "model.gguf")
    with pytest.raises(GGUFExportError, match="q8_0"):
        write_gguf(tmp_path, tmp_path / "model.gguf", "q4")
