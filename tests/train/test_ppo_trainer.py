import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hydrappo import HydraModel
from hydrappo.cli import main as cli_main
from hydrappo.config import ConfigError, GenerationArgs, parse_config
from hydrappo.generation.responses import generate_responses
from hydrappo.storage.checkpoint import WEIGHTS_NAME, checkpoint_dirs
from hydrappo.train.harness import TrainingError
from hydrappo.data import pack_sequences

from bounds import EXACT, assert_close_weights
from runs import TINY, tiny_trainer
from tiny import tiny_model, tiny_tokenizer

REQUIRED_SCALARS = [
    "env/reward_mean",
    "env/reward_std",
    "objective/kl",
    "objective/kl_coef",
    "objective/entropy",
    "ppo/loss/policy",
    "ppo/loss/value",
    "ppo/loss/total",
    "ppo/policy/approxkl",
    "ppo/policy/clipfrac",
    "ppo/val/clipfrac",
    "ppo/val/var_explained",
    "ppo/returns/mean",
    "tokens/responses_len_mean",
    "time/rollout",
    "time/update",
    "lr",
]


@pytest.mark.slow
def test_tiny_example_learns_and_writes_logs_and_checkpoints(tmp_path):
    history = tiny_trainer(tmp_path).train()
    rewards = [row["env/reward_mean"] for row in history]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.3, rewards

    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in metrics] == list(range(1, 21))
    for name in REQUIRED_SCALARS:
        assert name in metrics[-1], name

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    for name in REQUIRED_SCALARS:
        assert len(events.Scalars(name)) == 20, name
    assert "samples/text_summary" in events.Tags()["tensors"]

    kept = checkpoint_dirs(tmp_path)
    assert [path.name for path in kept] == ["checkpoint-10", "checkpoint-20"]
    saved = load_file(str(kept[-1] / WEIGHTS_NAME))
    assert any(name.startswith("value_head.") for name in saved)
    assert not any(".layers.0." in name or "embed_tokens" in name for name in saved)


def test_resume_without_checkpoint_and_mismatched_checkpoint_are_clear_errors(tmp_path):
    from hydrappo.storage.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match="no checkpoint found"):
        tiny_trainer(tmp_path, "--total_steps", "1").train(resume=True)
    tiny_trainer(tmp_path, "--total_steps", "1", "--batch_size", "8", "--mini_batch_size", "8").train()
    other = tiny_trainer(tmp_path, "--total_steps", "2", "--num_layers_unfrozen", "1")
    with pytest.raises(CheckpointError, match="num_layers_unfrozen"):
        other.train(resume=True)
    # The checkpoint that could not be loaded is still there.
    assert [p.name for p in checkpoint_dirs(tmp_path)] == ["checkpoint-1"]


def test_responses_end_at_the_first_eos_when_pad_is_eos():
    tokenizer = tiny_tokenizer()
    assert tokenizer.pad_token_id == tokenizer.eos_token_id
    model = tiny_model("llama")
    eos = tokenizer.eos_token_id
    # Make EOS likely, so that some responses stop early and get padded with the same id.
    with torch.no_grad():
        model.lm_head.weight[eos] *= 40
    hydra = HydraModel(model, num_layers_unfrozen=1)
    torch.manual_seed(0)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]] * 4
    args = GenerationArgs(max_new_tokens=6, generation_batch_size=5, stop_token_ids=[7])
    responses = generate_responses(hydra, tokenizer, prompts, args)
    assert len(responses.response_ids) == len(prompts)
    for tokens, ended in zip(responses.response_ids, responses.ended):
        stops = [i for i, t in enumerate(tokens) if t in (eos, 7)]
        if ended:
            assert stops == [len(tokens) - 1]  # the one stop token is the last one kept
        else:
            assert stops == [] and len(tokens) == 6
    assert any(responses.ended) and any(len(t) < 6 for t in responses.response_ids)

    input_ids, attention_mask, action_mask, width = pack_sequences(responses.prompt_ids, responses.response_ids, eos)
    for row, (prompt, tokens) in enumerate(zip(responses.prompt_ids, responses.response_ids)):
        assert action_mask[row].sum() == len(tokens)
        assert attention_mask[row].sum() == len(prompt) + len(tokens)
        assert input_ids[row, width : width + len(tokens)].tolist() == tokens


def test_stop_strings_end_responses():
    tokenizer = tiny_tokenizer()
    model = tiny_model("llama")
    stop_word = tokenizer.convert_tokens_to_ids("w50")
    with torch.no_grad():
        model.lm_head.weight[stop_word] *= 30  # likely, but not certain, at each step
    hydra = HydraModel(model, num_layers_unfrozen=1)
    torch.manual_seed(1)
    args = GenerationArgs(max_new_tokens=8, stop_strings=["w50"], generation_batch_size=8)
    responses = generate_responses(hydra, tokenizer, [[5, 6]] * 8, args)
    assert any(responses.ended)
    for tokens, ended in zip(responses.response_ids, responses.ended):
        text = tokenizer.decode(tokens)
        if ended:
            assert text.endswith("w50") and "w50" not in tokenizer.decode(tokens[:-1])
        else:
            assert "w50" not in text and len(tokens) == 8


@pytest.mark.slow
def test_nonfinite_losses_are_skipped_then_stop_with_the_checkpoint_intact(tmp_path, monkeypatch):
    trainer = tiny_trainer(
        tmp_path,
        "--total_steps",
        "3",
        "--save_every",
        "1",
        "--batch_size",
        "8",
        "--mini_batch_size",
        "4",
        "--ppo_epochs",
        "1",
        "--max_nonfinite_steps",
        "3",
    )
    trainer.train()
    weights_before = (checkpoint_dirs(tmp_path)[-1] / WEIGHTS_NAME).read_bytes()

    import hydrappo.train.ppo.step as trainer_module

    real_loss = trainer_module.ppo_loss

    def nan_loss(*args, **kwargs):
        loss, stats = real_loss(*args, **kwargs)
        return loss * float("nan"), stats

    monkeypatch.setattr(trainer_module, "ppo_loss", nan_loss)
    params_before = [p.clone() for p in trainer.hydra.trainable_parameters()]
    trainer.config.train.total_steps = 10
    with pytest.raises(TrainingError, match="3 non-finite .* last good checkpoint is (.*checkpoint-\\d+)") as error:
        trainer.train()
    assert trainer.harness.nonfinite_total == 3
    assert all(torch.equal(a, b) for a, b in zip(params_before, trainer.hydra.trainable_parameters()))
    named = Path(str(error.value).split("last good checkpoint is ")[1].split(". ")[0])
    assert named == checkpoint_dirs(tmp_path)[-1]
    assert (named / WEIGHTS_NAME).read_bytes() == weights_before


def test_config_errors_list_the_valid_choices(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("ppo:\n  learning_rat: 1.0\n")
    with pytest.raises(
        ConfigError, match="unknown key 'learning_rat' in section 'ppo'. Did you mean 'learning_rate'.* Valid keys: "
    ):
        parse_config(bad)
    bad.write_text("trainer:\n  x: 1\n")
    with pytest.raises(ConfigError, match="unknown section 'trainer'; valid sections: model, generation"):
        parse_config(bad)
    with pytest.raises(ConfigError, match="unknown command-line option.*--bogus.*valid options"):
        parse_config(TINY / "config.yaml", ["--bogus", "1"])
    with pytest.raises(ConfigError, match="multiple of mini_batch_size"):
        parse_config(TINY / "config.yaml", ["--batch_size", "10", "--mini_batch_size", "4"])
    config = parse_config(TINY / "config.yaml", ["--learning_rate", "1e-4", "--stop_strings", "a", "b"])
    assert config.ppo.learning_rate == 1e-4 and config.generation.stop_strings == ["a", "b"]
    assert cli_main(["train", str(bad)]) == 2


@pytest.mark.slow
def test_cli_train_runs_the_tiny_example(tmp_path, capsys):
    code = cli_main(
        [
            "train",
            str(TINY / "config.yaml"),
            "--output_dir",
            str(tmp_path),
            "--total_steps",
            "2",
            "--batch_size",
            "8",
            "--mini_batch_size",
            "8",
            "--no_progress_bar",
        ]
    )
    assert code == 0
    assert "done: step 2" in capsys.readouterr().out
    assert (tmp_path / "checkpoint-2" / "config.yaml").is_file()


@pytest.mark.slow
def test_gradient_checkpointing_gives_the_same_training(tmp_path):
    # In float64 with the bound of tests/helpers/bounds.py: recomputing the activations may sum in another order.
    args = ["--total_steps", "2", "--batch_size", "8", "--mini_batch_size", "4", "--save_every", "100", *EXACT]
    plain = tiny_trainer(tmp_path / "plain", *args)
    plain.train()
    checkpointed = tiny_trainer(tmp_path / "checkpointed", *args, "--gradient_checkpointing", "true")
    assert any(getattr(m, "gradient_checkpointing", False) for m in checkpointed.hydra.model.modules())
    checkpointed.train()
    trained = [{n: p for n, p in t.hydra.named_parameters() if p.requires_grad} for t in (plain, checkpointed)]
    updates = 2 * plain.config.ppo.ppo_epochs * 2  # steps x epochs x minibatches
    assert_close_weights(*trained, lr=plain.config.ppo.learning_rate, steps=updates)


@pytest.mark.slow
def test_bf16_model_trains_float32_master_weights_under_autocast(tmp_path):
    trainer = tiny_trainer(
        tmp_path,
        "--total_steps",
        "2",
        "--batch_size",
        "8",
        "--mini_batch_size",
        "4",
        "--dtype",
        "bfloat16",
        "--mixed_precision",
        "bf16",
        "--save_every",
        "100",
    )
    hydra = trainer.hydra
    assert {p.dtype for p in hydra.trainable_parameters()} == {torch.float32}
    assert hydra.arch.layers[0].mlp.down_proj.weight.dtype == torch.bfloat16  # the frozen trunk stays small
    before = [p.detach().clone() for p in hydra.trainable_parameters()]
    history = trainer.train()
    assert all(torch.isfinite(torch.tensor(row["ppo/loss/total"])) for row in history)
    moved = [(a - b).abs().max().item() for a, b in zip(before, hydra.trainable_parameters())]
    assert max(moved) > 0 and history[-1]["ppo/updates"] > 0

    with pytest.raises(ConfigError, match="needs autocast"):
        tiny_trainer(tmp_path / "no", "--dtype", "bfloat16", "--mixed_precision", "no")


@pytest.mark.slow
def test_critic_warmup_leaves_the_policy_bit_identical(tmp_path):
    trainer = tiny_trainer(tmp_path / "run", "--total_steps", "2", "--critic_warmup_steps", "2")
    hydra = trainer.hydra
    critic = {name for name, _ in hydra.named_parameters() if name.startswith("value_head.")}
    before = {name: p.detach().clone() for name, p in hydra.named_parameters()}
    history = trainer.train()
    assert [row["ppo/critic_warmup"] for row in history if "ppo/critic_warmup" in row] == [1.0, 1.0]
    policy = [name for name, p in hydra.named_parameters() if p.requires_grad and name not in critic]
    assert policy  # the top layers train in this config
    for name in policy:
        assert torch.equal(dict(hydra.named_parameters())[name], before[name]), name
    assert any(not torch.equal(p, before[name]) for name, p in hydra.named_parameters() if name in critic)
    # After the warm-up the policy moves.
    trainer.config.train.total_steps = 3
    trainer.train()
    assert any(not torch.equal(dict(hydra.named_parameters())[n], before[n]) for n in policy)
