"""A tiny Llama and a tiny Gemma 3 written to GGUF and read back with transformers' GGUF reader: the same
logits (f32 exactly; f16 within half-precision rounding), the same token ids, and q8_0 weights within
q8_0's blockwise rounding. Then the commands: `hydrappo export CHECKPOINT --out x.gguf` on a tiny checkpoint
(full and LoRA) gives the trained policy's logits and greedy tokens, a folder is a source too, what cannot be
written is refused before anything is, an existing file is kept; `hydrappo export from-gguf` (the other way)
names the command for this one; tools/export_gguf.py is the same export, and tools/check_gguf_llama_cpp.py
agrees with transformers where llama-cpp-python is installed (skipped where it is not)."""

from __future__ import annotations

import sys

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


def sentencepiece_bpe() -> PreTrainedTokenizerFast:
    """A SentencePiece-style BPE (Gemma's kind: byte fallback, spaces replaced by "\u2581", none prepended)."""
    from tokenizers import normalizers

    tokenizer = Tokenizer(models.BPE(byte_fallback=True))
    tokenizer.normalizer = normalizers.Replace(" ", "\u2581")
    trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=["<pad>", "<s>", "</s>"])
    tokenizer.train_from_iterator(TEXTS * 10, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def tiny_folder(family: str, path, tokenizer: PreTrainedTokenizerFast | None = None):
    tokenizer = tokenizer or byte_bpe()
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


# ---------------------------------------------------------------------------- hydrappo export CKPT --out x.gguf


def tiny_checkpoint(tmp_path, family="llama", lora=False):
    """A hydrappo checkpoint on a tiny float32 base (the folder above, byte-level BPE): the top 2 layers and the
    value head moved off their initial weights, as training would; with `lora`, LoRA adapters instead."""
    import yaml
    from peft import LoraConfig

    from hydrappo import HydraModel
    from hydrappo.config import Config
    from hydrappo.storage.checkpoint import save_checkpoint, trainable_state_dict

    tiny_folder(family, tmp_path / "base")
    config = Config()
    config.model.name_or_path, config.model.dtype, config.model.num_layers_unfrozen = (
        str(tmp_path / "base"),
        "float32",
        2,
    )
    adapters = None
    if lora:
        config.lora.lora_r, config.lora.lora_alpha, config.lora.lora_target_modules = 4, 8, ["q_proj", "v_proj"]
        adapters = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "base", dtype=torch.float32).eval()
    hydra = HydraModel(base, 2, lora=adapters)
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in hydra.trainable_parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    checkpoint = save_checkpoint(
        tmp_path / "run",
        1,
        weights=trainable_state_dict(hydra),
        training_state={},
        trainer_state={},
        config_yaml=yaml.safe_dump(config.to_dict()),
    )
    return hydra, checkpoint


def export_cli(argv, capsys):
    from hydrappo.cli import main

    capsys.readouterr()  # what the test's own writes printed (transformers' progress bars)
    code = main(["export", *map(str, argv)])
    said = capsys.readouterr()
    return code, said.out, said.err


def greedy(model, ids, new_tokens=8):
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)[0, ids.shape[1] :]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_the_cli_writes_a_checkpoints_policy_as_gguf(lora, tmp_path, capsys):
    hydra, checkpoint = tiny_checkpoint(tmp_path, lora=lora)
    code, out, err = export_cli([tmp_path / "run", "--out", tmp_path / "policy.gguf"], capsys)
    assert code == 0, err
    assert "policy.gguf (f16, GGUF arch llama" in out and "llama-cli -m" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base", "policy.gguf", "run"]  # no temporary left
    read = read_back(tmp_path, "policy.gguf", "llama")
    ids = byte_bpe()(TEXTS[1], return_tensors="pt").input_ids
    with torch.no_grad():
        policy = hydra.forward_hydra(ids, return_logits=True).logits
        assert not torch.allclose(policy, hydra.forward_hydra(ids, return_logits=True).ref_logits, atol=1e-3)
        # the f16 bound of test_gguf_round_trip: the trained policy, not the base model, is what was written
        assert (read(ids).logits - policy).abs().max() < 1e-2
    from hydrappo.storage.export import policy_model

    assert torch.equal(greedy(read, ids), greedy(policy_model(hydra), ids))


def test_a_transformers_folder_is_a_source_too(tmp_path, capsys):
    model, tokenizer = tiny_folder("gemma3", tmp_path / "model")
    code, out, err = export_cli([tmp_path / "model", "--out", tmp_path / "m.gguf", "--gguf-type", "f32"], capsys)
    assert code == 0, err
    ids = tokenizer(TEXTS[0], return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.equal(read_back(tmp_path, "m.gguf", "gemma3")(ids).logits, model(ids).logits)


def test_an_existing_gguf_is_kept_without_overwrite(tmp_path, capsys):
    tiny_folder("llama", tmp_path / "model")
    (tmp_path / "m.gguf").write_text("an earlier export\n")
    code, _, err = export_cli([tmp_path / "model", "--out", tmp_path / "m.gguf"], capsys)
    assert code == 2 and "already exists" in err and "--overwrite_output_dir" in err and "Traceback" not in err
    assert (tmp_path / "m.gguf").read_text() == "an earlier export\n"
    code, _, err = export_cli([tmp_path / "model", "--out", tmp_path / "m.gguf", "--overwrite"], capsys)
    assert code == 0, err
    (moved,) = tmp_path.glob("m.gguf.previous-*")
    assert moved.read_text() == "an earlier export\n" and (tmp_path / "m.gguf").read_bytes()[:4] == b"GGUF"


def test_an_unsupported_family_is_one_line_before_anything_is_written(tmp_path, capsys):
    from transformers import Qwen2Config

    hydra, checkpoint = tiny_checkpoint(tmp_path)
    config = Qwen2Config(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    config.num_attention_heads = 4
    config.save_pretrained(tmp_path / "base")  # the checkpoint's base model is now a Qwen2
    for source in (tmp_path / "run", tmp_path / "base"):
        code, _, err = export_cli([source, "--out", tmp_path / "q.gguf"], capsys)
        assert code == 2 and "'qwen2'" in err and "Llama-style" in err and "Gemma 3" in err, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not list(tmp_path.glob("*q.gguf*"))


def test_a_tokenizer_gguf_cannot_hold_is_refused_before_the_export(tmp_path, capsys):
    from runs import TINY

    model_dir = tmp_path / "model"
    tiny_folder("llama", model_dir)
    (model_dir / "tokenizer.json").write_bytes((TINY / "model" / "tokenizer.json").read_bytes())  # word-level
    code, _, err = export_cli([model_dir, "--out", tmp_path / "m.gguf"], capsys)
    assert code == 2 and "'WordLevel' model" in err and "BPE" in err
    assert not list(tmp_path.glob("*m.gguf*"))


def test_the_options_that_do_not_apply_are_named(tmp_path, capsys):
    tiny_folder("llama", tmp_path / "model")
    cases = [
        ([tmp_path / "model", "--out", tmp_path / "dir", "--gguf-type", "q8_0"], "applies to a GGUF file"),
        ([tmp_path / "model", "--out", tmp_path / "m.gguf", "--dtype", "float16"], "--gguf-type f16|q8_0|f32"),
        ([tmp_path / "model", "--out", tmp_path / "m.gguf", "--gguf-type", "q4"], "invalid choice: 'q4'"),
        ([tmp_path / "x.gguf", "--out", tmp_path / "dir"], "export from-gguf"),
    ]
    for argv, words in cases:
        code, _, err = export_cli(argv, capsys)
        assert code == 2 and words in err, (argv, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


# ---------------------------------------------------------------------------- hydrappo export from-gguf: the other way


def test_the_reading_direction_says_which_way_it_goes(tmp_path, capsys):
    hydra, checkpoint = tiny_checkpoint(tmp_path)
    write_gguf(tmp_path / "base", tmp_path / "base.gguf", "f32")
    for name in ("from-gguf", "gguf"):
        for out in ("model.gguf", "model.safetensors", "pytorch_model.bin"):
            code, _, err = export_cli([name, tmp_path / "base.gguf", "--out", tmp_path / out], capsys)
            assert code == 2 and "names a folder" in err and "hydrappo export CHECKPOINT --out model.gguf" in err
        for source in (tmp_path / "run", checkpoint):
            code, _, err = export_cli([name, source, "--out", tmp_path / "out"], capsys)
            assert code == 2 and "is a hydrappo checkpoint, not a GGUF file" in err
            assert f"hydrappo export {source} --out model.gguf" in err
        code, _, err = export_cli([name, tmp_path / "base", "--out", tmp_path / "out"], capsys)
        assert code == 2 and f"hydrappo export {tmp_path / 'base'} --out model.gguf" in err
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob("model.*")) and not list(tmp_path.glob("*.bin"))
    from hydrappo.cli import main

    for name in ("from-gguf", "gguf"):
        assert main(["export", name, "--help"]) == 0
        assert "GGUF file -> safetensors folder" in capsys.readouterr().out
    code, _, err = export_cli(["from-gguf", tmp_path / "base.gguf", "--out", tmp_path / "out"], capsys)
    assert code == 0 and (tmp_path / "out" / "config.json").is_file(), err


# ---------------------------------------------------------------------------- tools/export_gguf.py, tools/check_gguf_llama_cpp.py


def tool(name):
    import importlib.util

    from runs import ROOT

    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_tool_script_is_the_same_export(tmp_path, capsys):
    from hydrappo.storage.gguf_export import GGUF_TYPES

    export_gguf = tool("export_gguf")
    assert export_gguf.GGUF_TYPES == GGUF_TYPES
    hydra, checkpoint = tiny_checkpoint(tmp_path)
    assert export_gguf.main([str(tmp_path / "run"), "--out", str(tmp_path / "p.gguf"), "--gguf-type", "f32"]) == 0
    ids = byte_bpe()(TEXTS[2], return_tensors="pt").input_ids
    with torch.no_grad():
        logits = read_back(tmp_path, "p.gguf", "llama")(ids).logits
        assert (logits - hydra.forward_hydra(ids, return_logits=True).logits).abs().max() < 1e-5
    capsys.readouterr()
    assert export_gguf.main([str(tmp_path / "run"), "--out", str(tmp_path / "p.gguf")]) == 2
    assert "already exists" in capsys.readouterr().err


def test_the_llama_cpp_check_says_how_to_install_its_bindings(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp raises ImportError
    assert tool("check_gguf_llama_cpp").main(["--gguf", "x.gguf", "--model", str(tmp_path)]) == 2
    assert "pip install llama-cpp-python" in capsys.readouterr().err


def test_llama_cpp_runs_the_file_as_transformers_does(tmp_path, capsys):
    """Where llama-cpp-python is installed: a tiny f32 file's greedy tokens in llama.cpp are transformers'."""
    pytest.importorskip("llama_cpp")
    tiny_folder("llama", tmp_path / "model")
    write_gguf(tmp_path / "model", tmp_path / "m.gguf", "f32")
    check = tool("check_gguf_llama_cpp")
    argv = ["--gguf", str(tmp_path / "m.gguf"), "--model", str(tmp_path / "model"), "--new-tokens", "8"]
    assert check.main([*argv, "--min-agree", "8"]) == 0, capsys.readouterr().out
    assert "fewest tokens agreeing before a mismatch: 8/8 on 4 prompts" in capsys.readouterr().out


@pytest.mark.slow
def test_the_gguf_to_safetensors_script_is_export_from_gguf(tmp_path):
    import os
    import subprocess

    from runs import ROOT

    model, tokenizer = tiny_folder("llama", tmp_path / "model")
    write_gguf(tmp_path / "model", tmp_path / "m.gguf", "f32")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    command = [sys.executable, str(ROOT / "tools" / "gguf_to_safetensors.py"), "m.gguf", "--out", "converted"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert done.returncode == 0 and "converted" in done.stdout, done.stderr
    ids = tokenizer(TEXTS[0], return_tensors="pt").input_ids
    with torch.no_grad():
        converted = AutoModelForCausalLM.from_pretrained(tmp_path / "converted", dtype=torch.float32).eval()
        assert torch.equal(converted(ids).logits, model(ids).logits)  # f32 GGUF: the same weights
    assert AutoTokenizer.from_pretrained(tmp_path / "converted")(TEXTS[0]).input_ids == ids[0].tolist()
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert done.returncode == 2 and "gguf_to_safetensors.py: --out" in done.stderr and "Traceback" not in done.stderr


def test_whether_a_sentencepiece_tokenizer_prepends_a_space_is_read_from_its_json():
    from hydrappo.storage.gguf_export import prepends_space

    gemma = {"normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}}
    llama2 = {
        "normalizer": {
            "type": "Sequence",
            "normalizers": [{"type": "Prepend", "prepend": "\u2581"}, gemma["normalizer"]],
        }
    }
    assert not prepends_space(gemma)
    assert prepends_space(llama2)
    assert prepends_space({"pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first"}})
    assert not prepends_space({"pre_tokenizer": {"type": "Metaspace", "prepend_scheme": "never"}})
    assert prepends_space({"pre_tokenizer": {"type": "Metaspace", "add_prefix_space": True}})  # older files


def test_a_gemma_style_tokenizer_is_written_without_llama_cpps_space_prefix(tmp_path):
    # llama.cpp's SentencePiece tokenizer prepends "\u2581" unless the file says not to; Gemma's tokenizer does not
    import gguf

    tiny_folder("gemma3", tmp_path / "model", tokenizer=sentencepiece_bpe())
    write_gguf(tmp_path / "model", tmp_path / "m.gguf", "f32")
    field = gguf.GGUFReader(tmp_path / "m.gguf").fields["tokenizer.ggml.add_space_prefix"]
    assert bool(field.parts[field.data[0]][0]) is False
