"""The trainers built from Python objects, as TRL users write them (train/api.py): a model (path
or loaded), reward function objects with weights, datasets as objects, a dict of options; the
same config rules as the command line; the trained policy saved and reloaded with plain
transformers; the SFT and reward stages built the same way, each saving what its stage makes."""

import json
from pathlib import Path

import pytest
import torch
import yaml
from datasets import Dataset
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from hydrappo import Config, PPOTrainer, RewardTrainer, SFTTrainer
from hydrappo.config import ConfigError
from hydrappo.errors import UsageError

from runs import TINY, write_pairs

ROWS = [json.loads(line) for line in (TINY / "prompts.jsonl").read_text().splitlines()]
TRAIN = [{"prompt": row["prompt"], "answer": row["prompt"].split()[-1]} for row in ROWS]


def good_words(completions, **kwargs):
    return [float(c.count("good")) for c in completions]


def mentions_answer(prompts, completions, answer, **kwargs):
    for prompt, a in zip(prompts, answer):
        assert prompt.split()[-1] == a  # the answer column stays aligned with its prompt
    return [float(a in c) for c, a in zip(completions, answer)]


def args(tmp_path: Path, **train) -> dict:
    return {
        "model": {"random_init": True, "num_layers_unfrozen": 2},
        "generation": {"max_new_tokens": 4, "generation_batch_size": 8},
        "ppo": {"batch_size": 8, "mini_batch_size": 4, "ppo_epochs": 1, "kl_controller": "fixed"},
        "train": {
            "output_dir": str(tmp_path / "run"),
            "total_steps": 2,
            "save_every": 0,
            "progress_bar": False,
            **train,
        },
    }


@pytest.mark.slow
def test_objects_in_train_save_and_reload_with_transformers(tmp_path):
    trainer = PPOTrainer(
        model=str(TINY / "model"),
        reward_funcs=[good_words, mentions_answer],
        reward_weights=[1.0, 0.5],
        train_dataset=Dataset.from_list(TRAIN),
        eval_dataset=TRAIN[:4],
        args=args(tmp_path),
    )
    history = trainer.train()
    assert [row["step"] for row in history if "env/reward_mean" in row] == [1, 2]
    for row in history:
        if "env/reward_mean" in row:
            parts = row["env/reward/good_words"], row["env/reward/mentions_answer"]
            assert row["env/reward_mean"] == pytest.approx(parts[0] + 0.5 * parts[1], rel=1e-6)
    assert [row["step"] for row in history if "eval/reward_mean" in row] == [0, 2]
    recorded = yaml.safe_load((sorted((tmp_path / "run").glob("checkpoint-*"))[-1] / "config.yaml").read_text())
    assert recorded["reward"]["reward_fn"] == [f"{__name__}:good_words", f"{__name__}:mentions_answer"]
    assert recorded["data"]["prompts"] == f"<in-memory table of {len(TRAIN)} rows>"

    out = trainer.save_model(tmp_path / "policy")
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    trained = trainer.hydra.model.state_dict()
    for name, tensor in reloaded.state_dict().items():
        assert torch.equal(tensor, trained[name].to(tensor.dtype)), name
    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = tokenizer("n1 n2", return_tensors="pt").input_ids
    assert reloaded.generate(ids, max_new_tokens=2, do_sample=False).shape == (1, ids.shape[1] + 2)


@pytest.mark.slow
def test_a_loaded_model_first_in_trls_order_with_its_tokenizer(tmp_path):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY / "model"))
    tokenizer = AutoTokenizer.from_pretrained(TINY / "model")
    options = args(tmp_path, total_steps=1)
    options["model"] = {"num_layers_unfrozen": 2}
    trainer = PPOTrainer(model, reward_funcs=good_words, train_dataset=TRAIN, args=options, processing_class=tokenizer)
    assert trainer.hydra.model is model  # wrapped, not reloaded
    assert trainer.config.reward.reward_fn == [good_words]
    trainer.train()


def test_the_command_lines_rules_apply(tmp_path):
    with pytest.raises(ConfigError, match=r"ppo.mini_batch_size=3"):
        PPOTrainer(
            model=str(TINY / "model"),
            reward_funcs=good_words,
            train_dataset=TRAIN,
            args={**args(tmp_path), "ppo": {"batch_size": 8, "mini_batch_size": 3}},
        )
    with pytest.raises(
        ConfigError, match=r"reward.reward_weights=\[1.0, 2.0, 3.0\] has 3 weight\(s\) for 1 reward source"
    ):
        PPOTrainer(
            model=str(TINY / "model"),
            reward_funcs=good_words,
            reward_weights=[1, 2, 3],
            train_dataset=TRAIN,
            args=args(tmp_path),
        )
    with pytest.raises(ConfigError, match="unknown key 'batchsize' in section 'ppo'"):
        PPOTrainer(
            model=str(TINY / "model"), reward_funcs=good_words, train_dataset=TRAIN, args={"ppo": {"batchsize": 8}}
        )
    with pytest.raises(ConfigError, match="unknown argument"):
        PPOTrainer(model=str(TINY / "model"), reward_fns=good_words)
    assert not (tmp_path / "run").exists()


def test_a_config_object_is_copied_not_changed(tmp_path):
    config = Config()
    config.model.random_init, config.train.output_dir, config.train.total_steps = True, str(tmp_path / "run"), 1
    trainer = PPOTrainer(config, model=str(TINY / "model"), reward_funcs=good_words, train_dataset=TRAIN)
    assert trainer.config.reward.reward_fn == [good_words] and trainer.config.model.name_or_path == str(TINY / "model")
    assert config.reward.reward_fn is None and config.model.name_or_path != str(TINY / "model")


# SFT rows: each prompt word n<k> answered with g<k mod 8> (learnable, unlike what a random model says).
SFT = [
    {"prompt": row["prompt"], "response": " ".join(f"g{int(w[1:]) % 8}" for w in row["prompt"].split())} for row in ROWS
]


def stage_args(tmp_path: Path, **train) -> dict:
    return {
        "model": {"random_init": True, "num_layers_unfrozen": 2, "train_lm_head": True},
        "data": {"max_prompt_length": 16, "max_response_length": 12},
        "train": {
            "output_dir": str(tmp_path / "run"),
            "max_steps": 3,
            "batch_size": 16,
            "learning_rate": 3e-3,
            "save_every": 0,
            "progress_bar": False,
            **train,
        },
    }


def test_sft_from_objects_trains_saves_and_reloads_with_transformers(tmp_path):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY / "model"))
    options = stage_args(tmp_path)
    options["model"].pop("random_init")
    trainer = SFTTrainer(
        model,
        train_dataset=Dataset.from_list(SFT[:96]),
        eval_dataset=SFT[96:],
        args=options,
        processing_class=AutoTokenizer.from_pretrained(TINY / "model"),
    )
    assert trainer.hydra.model is model  # wrapped, not reloaded
    history = trainer.train()
    evaluations = [row["eval/loss"] for row in history if "eval/loss" in row]
    assert history[0]["step"] == 0 and evaluations[-1] < evaluations[0]  # 32 held-out rows, evaluated before and after
    assert (tmp_path / "run" / "config.json").is_file()  # the finished run wrote its model, as `hydrappo sft` does
    out = trainer.save_model(tmp_path / "sft-model")
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    trained = trainer.hydra.model.state_dict()
    for name, tensor in reloaded.state_dict().items():
        assert torch.equal(tensor, trained[name].to(tensor.dtype)), name
    recorded = yaml.safe_load((out / "sft_config.yaml").read_text())
    assert recorded["data"]["train_file"] == "<in-memory table of 96 rows>"


def test_reward_stage_from_objects_saves_a_branch_that_ppo_loads(tmp_path):
    write_pairs(tmp_path / "pairs.jsonl")
    options = stage_args(tmp_path, learning_rate=1e-3)
    options["model"].pop("train_lm_head")
    options["data"]["eval_fraction"] = 0.2
    trainer = RewardTrainer(model=str(TINY / "model"), train_dataset=tmp_path / "pairs.jsonl", args=options)
    trainer.train()
    with pytest.raises(UsageError, match="holds other files; give a new or empty folder"):
        trainer.save_model(tmp_path / "run")  # the run's own folder: never replaced
    saved = trainer.save_model(tmp_path / "reward-model")
    assert sorted(p.name for p in saved.iterdir()) == [
        "config.yaml",
        "manifest.json",
        "trainable.safetensors",
        "trainer_state.json",
    ]

    ppo = PPOTrainer(
        model=str(TINY / "model"),
        reward_funcs=None,
        train_dataset=TRAIN,
        args={
            **args(tmp_path / "ppo"),
            "model": {"random_init": True, "num_layers_unfrozen": 2, "reward_branch_path": str(saved)},
            "reward": {"use_reward_branch": True, "score_normalization": "ref"},
        },
    )
    # The reference statistics the stage computed at its end, and its trained weights.
    assert ppo.config.reward.score_ref_mean == trainer.score_stats["score_mean"]
    assert ppo.config.reward.score_ref_std == trainer.score_stats["score_std"]
    trained = dict(trainer.branch.named_parameters())
    for name, param in ppo.hydra.reward_branch.named_parameters():
        assert torch.equal(param, trained[name]), name
