"""SFT of the top layers: response-only loss, a plain transformers model directory as
output, and PPO starting from it."""

import json
import math
import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from hydrappo.algo.losses import response_nll
from hydrappo.cli import main as cli_main
from hydrappo.config import ConfigError, ModelConfig, SFTConfig, parse_config
from hydrappo.storage.export import save_model_dir
from hydrappo.storage.models import load_model_and_tokenizer
from hydrappo.train.ppo import PPOTrainer
from hydrappo.train.sft import SFTTrainer

from runs import TINY, write_sft_config
from tiny import FLOAT64_ATOL


def test_response_nll_counts_only_response_tokens():
    logprobs = torch.tensor([[-1.0, -2.0, -9.0], [-3.0, -9.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    loss, tokens = response_nll(logprobs, mask)
    assert tokens.item() == 3 and loss.item() == pytest.approx(2.0)
    assert response_nll(logprobs, torch.zeros_like(mask))[0].item() == 0.0  # no tokens: no NaN


@pytest.mark.slow
def test_sft_lowers_the_response_loss_and_ppo_starts_from_its_model_dir(tmp_path, capsys):
    assert cli_main(["sft", str(write_sft_config(tmp_path))]) == 0
    assert "held-out response loss" in capsys.readouterr().out
    out = tmp_path / "sft"
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [row["eval/loss"] for row in metrics if "eval/loss" in row]
    assert metrics[0]["step"] == 0 and len(evals) == 4  # before training and after each epoch
    assert evals[-1] < evals[0] - 1.0, evals

    # A plain transformers model directory, safetensors only.
    assert (out / "model.safetensors").is_file() and not list(out.glob("*.bin"))
    loaded = AutoModelForCausalLM.from_pretrained(out)
    torch.manual_seed(0)  # the base model: the same random init as the SFT run's
    base, _ = load_model_and_tokenizer(ModelConfig(name_or_path=str(TINY / "model"), random_init=True))
    trained, original = dict(loaded.named_parameters()), dict(base.named_parameters())
    assert torch.equal(trained["model.layers.0.mlp.up_proj.weight"], original["model.layers.0.mlp.up_proj.weight"])
    assert torch.equal(trained["model.embed_tokens.weight"], original["model.embed_tokens.weight"])
    assert not torch.equal(trained["model.layers.3.mlp.up_proj.weight"], original["model.layers.3.mlp.up_proj.weight"])
    # The lm_head trained (train_lm_head): untied from the embeddings, and saved as such.
    assert loaded.lm_head.weight.data_ptr() != loaded.model.embed_tokens.weight.data_ptr()
    assert not torch.equal(loaded.lm_head.weight, original["model.embed_tokens.weight"])

    # The saved model reproduces the trainer's final held-out loss (same split from the same seed).
    config = parse_config(
        tmp_path / "sft.yaml",
        ["--random_init", "false", "--name_or_path", str(out), "--output_dir", str(tmp_path / "again")],
        config_cls=SFTConfig,
    )
    assert SFTTrainer(config, config_dir=tmp_path).evaluate()["eval/loss"] == pytest.approx(evals[-1], rel=1e-4)

    # compare takes the SFT folder (its model, and checkpoints beside it) as the model it wrote.
    from hydrappo.evaluation.compare import compare

    assert list(out.glob("checkpoint-*"))  # a run folder too: its newest checkpoint holds no value head
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("n1 n2\nn3 n4\n")
    columns = compare([f"sft={out}"], prompts=str(prompts), max_new_tokens=2)
    assert [len(rows) for rows in columns.values()] == [2]

    # PPO from the SFT model: its reference is the SFT policy.
    ppo_config = parse_config(
        TINY / "config.yaml",
        [
            "--name_or_path",
            str(out),
            "--random_init",
            "false",
            "--output_dir",
            str(tmp_path / "ppo"),
            "--total_steps",
            "2",
            "--batch_size",
            "8",
            "--mini_batch_size",
            "8",
            "--no_progress_bar",
        ],
    )
    ppo = PPOTrainer(ppo_config, config_dir=TINY)
    history = ppo.train()
    assert len(history) == 2 and all(math.isfinite(row["objective/kl"]) for row in history)
    # At the first rollout the policy IS the reference (the SFT model): no KL yet.
    assert history[0]["objective/kl"] == pytest.approx(0.0, abs=1e-4)


def test_interrupted_save_never_looks_like_a_complete_model(tmp_path, monkeypatch):
    model, tokenizer = load_model_and_tokenizer(ModelConfig(name_or_path=str(TINY / "model"), random_init=True))
    out = save_model_dir(model, tokenizer, tmp_path / "model")
    assert (out / "config.json").is_file()
    (out / "pytorch_model.bin").write_bytes(b"stale weights of an older model")

    real_replace = os.replace

    def crash_on_config(src, dst):
        if Path(dst).name == "config.json":
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", crash_on_config)
    with pytest.raises(KeyboardInterrupt):
        save_model_dir(model, tokenizer, out)
    # Weights were replaced, but without config.json the folder is not a model yet.
    assert not (out / "config.json").exists() and not (out / "pytorch_model.bin").exists()
    assert not list(out.glob(".*.tmp-*"))
    monkeypatch.setattr(os, "replace", real_replace)
    save_model_dir(model, tokenizer, out)
    assert AutoModelForCausalLM.from_pretrained(out) is not None


def test_sft_config_errors(tmp_path, capsys):
    config_path = write_sft_config(tmp_path)
    assert cli_main(["sft", str(config_path), "--response_column", "answer"]) == 2
    assert "no column 'answer'" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="eval_fraction=1.5 must be in"):
        parse_config(config_path, ["--eval_fraction", "1.5"], config_cls=SFTConfig)
    config = parse_config(config_path, [], config_cls=SFTConfig)
    config.data.eval_fraction = 1.5  # a config built in code is checked by the trainer
    with pytest.raises(ConfigError, match="eval_fraction=1.5 must be in"):
        SFTTrainer(config, config_dir=tmp_path)


def test_lora_sft_writes_a_peft_adapter_that_ppo_starts_from(tmp_path):
    from peft import PeftModel

    # In float64: peft's model and the trainer's compute the policy by other modules (tests/helpers/tiny.py: FLOAT64_ATOL).
    lora = ["--lora_r", "4", "--lora_alpha", "8", "--train_lm_head", "false", "--dtype", "float64"]
    config = parse_config(write_sft_config(tmp_path, epochs=1), [*lora, "--learning_rate", "1e-2"], SFTConfig)
    trainer = SFTTrainer(config)
    history = trainer.train()
    evals = [row["eval/loss"] for row in history if "eval/loss" in row]
    assert evals[-1] < evals[0], evals
    out = tmp_path / "sft"
    assert (out / "adapter_config.json").is_file() and (out / "adapter_model.safetensors").is_file()
    assert not (out / "config.json").exists()  # an adapter, not a whole model

    # peft loads it onto the base model, and the result is the trained policy.
    torch.manual_seed(0)  # the base model: the same random init as the SFT run's
    base, _ = load_model_and_tokenizer(
        ModelConfig(name_or_path=str(TINY / "model"), random_init=True), dtype=torch.float64
    )
    loaded = PeftModel.from_pretrained(base, str(out)).eval()
    ids = torch.tensor([[1, 5, 6, 7, 8]])
    with torch.no_grad():
        logits = loaded(input_ids=ids).logits
        assert logits.dtype == torch.float64
        torch.testing.assert_close(logits, trainer.hydra.model(input_ids=ids).logits, atol=FLOAT64_ATOL, rtol=0)

    # PPO starts from it: the adapter is merged into the base, so the reference is the SFT policy.
    ppo_config = parse_config(
        TINY / "config.yaml",
        [
            *lora,
            "--lora_init_adapter",
            str(out),
            "--output_dir",
            str(tmp_path / "ppo"),
            "--total_steps",
            "1",
            "--batch_size",
            "8",
            "--mini_batch_size",
            "8",
            "--no_progress_bar",
        ],
    )
    first = PPOTrainer(ppo_config).train()[0]
    assert first["objective/kl"] == pytest.approx(0.0, abs=1e-4)


def test_lora_dropout_is_refused_clearly():
    with pytest.raises(ConfigError, match="lora_dropout=0.1: hydrappo runs every model without dropout"):
        parse_config(TINY / "config.yaml", ["--lora_r", "4", "--lora_dropout", "0.1", "--train_lm_head", "false"])
