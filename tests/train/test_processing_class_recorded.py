"""A run given its tokenizer in Python (`processing_class`) records it: the tokenizer is saved once into
the run folder (OUTPUT_DIR/tokenizer/, after the folder was claimed, so nothing is written before a
refusal), and model.tokenizer_name_or_path names that folder in every checkpoint's config.yaml. What
rebuilds the run from its folder then loads that tokenizer, not the model's own: `generate`,
`load_checkpoint_hydra` (export), and `--resume` from the command line. A Python resume given the same
tokenizer again is accepted without a warning; one given another tokenizer is refused. The tiny
example's own tokenizer has no chat template; the one given has (the same vocabulary), and the runs
render their prompts with it (data.apply_chat_template), so a rebuilt run that took the model's own
tokenizer could not even format its prompts."""

import json
import logging
from pathlib import Path

import pytest
import yaml
from transformers import AutoTokenizer

from hydrappo import PPOTrainer, RewardTrainer, SFTTrainer
from hydrappo.storage.checkpoint import CheckpointError
from hydrappo.storage.rundir import claim_output_dir, release_output_dir

from runs import TINY, TINY_TOOL_TEMPLATE, VERIFIABLE, write_pairs

ROWS = [json.loads(line) for line in (TINY / "prompts.jsonl").read_text().splitlines()]
SFT = [{"prompt": row["prompt"], "response": "g1 g2"} for row in ROWS]
PROBES = ["n1 n2 g3", "g0 g7 n40 n5", ROWS[0]["prompt"]]


def chat_tokenizer(template: str = TINY_TOOL_TEMPLATE):
    """The tiny model's tokenizer (the same vocabulary) with a chat template, which its own lacks."""
    tokenizer = AutoTokenizer.from_pretrained(TINY / "model")
    tokenizer.chat_template = template
    return tokenizer


def ppo_args(tmp_path: Path, total_steps: int = 1) -> dict:
    """A PPO run in the YAML file's shape (the command line can resume it from a file of these)."""
    return {
        "model": {"name_or_path": str(TINY / "model"), "random_init": True, "num_layers_unfrozen": 2},
        "generation": {"max_new_tokens": 4},
        "ppo": {"batch_size": 8, "mini_batch_size": 8, "ppo_epochs": 1},
        "reward": {"reward_fn": VERIFIABLE},
        "data": {"prompts": str(TINY / "prompts.jsonl"), "apply_chat_template": True},
        "train": {"output_dir": str(tmp_path / "run"), "total_steps": total_steps, "progress_bar": False},
    }


def stage_args(tmp_path: Path, **data) -> dict:
    return {
        "model": {"random_init": True, "num_layers_unfrozen": 2},
        "data": {"apply_chat_template": True, "eval_fraction": 0.2, **data},
        "train": {"output_dir": str(tmp_path / "run"), "max_steps": 1, "progress_bar": False},
    }


def assert_same_tokenizer(folder, tokenizer) -> None:
    saved = AutoTokenizer.from_pretrained(folder)
    assert saved.chat_template == tokenizer.chat_template == TINY_TOOL_TEMPLATE
    assert saved.get_vocab() == tokenizer.get_vocab()
    assert (saved.pad_token, saved.eos_token, saved.bos_token) == (
        tokenizer.pad_token,
        tokenizer.eos_token,
        tokenizer.bos_token,
    )
    for text in PROBES:
        assert saved(text)["input_ids"] == tokenizer(text)["input_ids"]
    message = [{"role": "user", "content": PROBES[0]}]
    assert saved.apply_chat_template(message, tokenize=False) == tokenizer.apply_chat_template(message, tokenize=False)


def recorded_tokenizer(checkpoint: Path):
    return yaml.safe_load((checkpoint / "config.yaml").read_text())["model"]["tokenizer_name_or_path"]


def test_a_ppo_run_records_the_given_tokenizer_and_its_folder_rebuilds_with_it(tmp_path, caplog):
    from hydrappo.evaluation.compare import generate
    from hydrappo.storage.export import load_checkpoint_hydra

    run = tmp_path / "run"
    assert AutoTokenizer.from_pretrained(TINY / "model").chat_template is None  # the model's own: none
    tokenizer = chat_tokenizer()
    trainer = PPOTrainer(args=ppo_args(tmp_path), processing_class=tokenizer)
    assert not run.exists()  # nothing written before the run claims its folder
    trainer.train()
    saved = run / "tokenizer"
    assert recorded_tokenizer(run / "checkpoint-1") == str(saved.absolute())
    assert_same_tokenizer(saved, tokenizer)

    hydra, rebuilt, config = load_checkpoint_hydra(run / "checkpoint-1")  # what `hydrappo export` rebuilds
    assert rebuilt.chat_template == TINY_TOOL_TEMPLATE
    assert rebuilt(PROBES[2])["input_ids"] == tokenizer(PROBES[2])["input_ids"]
    # generate renders the run's prompts with the chat template: the model's own tokenizer has none.
    (rows,) = generate(run, prompts=str(TINY / "prompts.jsonl"), limit=2, no_base=True).values()
    assert len(rows) == 2

    # A Python resume given the same tokenizer again (the same args): no refusal, no tokenizer warning.
    caplog.clear()
    resumed = PPOTrainer(args=ppo_args(tmp_path, total_steps=2), processing_class=chat_tokenizer())
    with caplog.at_level(logging.WARNING, logger="hydrappo"):
        history = resumed.train(resume=True)
    assert history[-1]["step"] == 2
    assert "tokenizer" not in caplog.text
    assert recorded_tokenizer(run / "checkpoint-2") == str(saved.absolute())

    # Another tokenizer for the same run is refused before anything loads or is written.
    other = PPOTrainer(args=ppo_args(tmp_path, total_steps=3), processing_class=chat_tokenizer("{{ messages }}"))
    with pytest.raises(CheckpointError, match="processing_class is not the tokenizer this run trained with.*chat"):
        other.train(resume=True)
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    assert_same_tokenizer(saved, tokenizer)

    # The command line resumes it with the recorded tokenizer (its config names none).
    from hydrappo.cli import main

    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(ppo_args(tmp_path, total_steps=3)))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hydrappo"):
        assert main(["train", str(config_file), "--resume"]) == 0
    assert "saved in" in caplog.text and "continuing with it" in caplog.text
    assert "tokenizer_name_or_path:" not in caplog.text  # no option-change warning about it
    assert recorded_tokenizer(run / "checkpoint-3") == str(saved.absolute())


def test_sft_and_reward_runs_record_the_given_tokenizer(tmp_path):
    tokenizer = chat_tokenizer()
    sft = SFTTrainer(
        model=str(TINY / "model"), processing_class=tokenizer, train_dataset=SFT, args=stage_args(tmp_path / "sft")
    )
    sft.train()
    run = tmp_path / "sft" / "run"
    assert recorded_tokenizer(run / "checkpoint-1") == str((run / "tokenizer").absolute())
    assert_same_tokenizer(run / "tokenizer", tokenizer)
    # The model folder SFT writes into output_dir carried the given tokenizer already, and its config names the saved one.
    assert_same_tokenizer(run, tokenizer)
    assert yaml.safe_load((run / "sft_config.yaml").read_text())["model"]["tokenizer_name_or_path"] == str(
        (run / "tokenizer").absolute()
    )

    write_pairs(tmp_path / "pairs.jsonl")
    reward = RewardTrainer(
        model=str(TINY / "model"),
        processing_class=tokenizer,
        train_dataset=tmp_path / "pairs.jsonl",
        args=stage_args(tmp_path / "reward"),
    )
    reward.train()
    run = tmp_path / "reward" / "run"
    assert recorded_tokenizer(run / "checkpoint-1") == str((run / "tokenizer").absolute())
    assert_same_tokenizer(run / "tokenizer", tokenizer)


def test_a_run_given_no_tokenizer_records_none(tmp_path):
    trainer = PPOTrainer(args={**ppo_args(tmp_path), "data": {"prompts": str(TINY / "prompts.jsonl")}})
    trainer.train()
    assert not (tmp_path / "run" / "tokenizer").exists()
    assert recorded_tokenizer(tmp_path / "run" / "checkpoint-1") is None


def test_the_saved_tokenizer_of_a_run_that_wrote_no_checkpoint_blocks_nothing(tmp_path):
    run = tmp_path / "run"
    (run / "tokenizer").mkdir(parents=True)
    (run / "tokenizer" / "tokenizer_config.json").write_text("{}")
    (run / "metrics.jsonl").write_text("")
    try:
        moved = claim_output_dir(run)  # a fresh run: those files move aside, as the logs of a failed run do
    finally:
        release_output_dir(run)
    assert moved == tmp_path / "run.previous" and (moved / "tokenizer" / "tokenizer_config.json").is_file()


def test_another_run_folders_copy_of_the_same_tokenizer_is_no_change_on_resume(tmp_path):
    from hydrappo.storage.resume import resume_differences

    def saved(folder: Path, tokenizer) -> dict:
        tokenizer.save_pretrained(folder / "tokenizer")
        return {"model": {"tokenizer_name_or_path": str(folder / "tokenizer")}}

    first, same, other = (
        saved(tmp_path / "a", chat_tokenizer()),
        saved(tmp_path / "b", chat_tokenizer()),
        saved(tmp_path / "c", chat_tokenizer("{{ messages }}")),
    )
    assert resume_differences(first, same) == ([], [])  # resumed from run a's checkpoint into run b
    assert "model.tokenizer_name_or_path" in resume_differences(first, other)[1][0]
