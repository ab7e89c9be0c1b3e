"""A base model, whose tokenizer has no chat template (the tiny example's has none, as Gemma 3 270M's
GGUF file has none): a run that needs one is refused before any model loads or any GGUF file
converts, from the tokenizer's files or the GGUF file's metadata (storage/gguf_metadata.py), in one
line with what to do; a reasoning-gym task renders its prompts as plain text instead, and says so."""

from __future__ import annotations

import logging

import pytest
import yaml

from hydrappo import PPOTrainer
from hydrappo.cli import main
from hydrappo.config import parse_config
from hydrappo.errors import UsageError

from runs import TINY

SMALL = {"min_terms": 2, "max_terms": 3, "max_digits": 1}


def refuse_loading(monkeypatch):
    """Loading a model, or converting a GGUF file, fails the test: the run must be refused first."""

    def load(*args, **kwargs):
        raise AssertionError("a model was loaded (or a GGUF file converted) for a run that is refused")

    monkeypatch.setattr("hydrappo.train.harness.build_hydra", load)
    monkeypatch.setattr("hydrappo.storage.models.load_gguf", load)


def config_file(tmp_path, model: str, task: dict | None = None) -> str:
    """The tiny example's config with the chat template on, its prompts and reward or a task's."""
    config = yaml.safe_load((TINY / "config.yaml").read_text())
    config["model"]["name_or_path"] = model
    config["data"] = {"max_prompt_length": 16, "apply_chat_template": True}
    if task is None:
        config["reward"]["reward_fn"] = str(TINY / "reward.py") + ":reward_fn"
        config["data"]["prompts"] = str(TINY / "prompts.jsonl")
    else:
        del config["reward"]["reward_fn"]
        config["task"] = task
    config["generation"] = {"max_new_tokens": 4, "generation_batch_size": 8}
    config["ppo"].update(batch_size=8, mini_batch_size=8, ppo_epochs=1)
    config["train"].update(output_dir=str(tmp_path / "run"), total_steps=1, progress_bar=False)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def base_gguf(tmp_path):
    """A GGUF file whose metadata holds no chat template (loading it would fail: it has no weights)."""
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "base.gguf"
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_array("tokenizer.ggml.tokens", ["<pad>", "<eos>", "<bos>", "a"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_command_line_refuses_a_chat_template_run_on_a_base_model_in_one_line(tmp_path, monkeypatch, capsys):
    refuse_loading(monkeypatch)
    assert main(["train", config_file(tmp_path, str(TINY / "model"))]) == 2
    err = capsys.readouterr().err
    assert "has no chat template (a base model's tokenizer has none), and data.apply_chat_template is set" in err
    assert "data.apply_chat_template: false" in err and "model.tokenizer_name_or_path" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_a_gguf_file_without_a_chat_template_is_refused_before_it_converts(tmp_path, monkeypatch):
    """From Python too (no command line read the inputs first): the file's metadata says it."""
    refuse_loading(monkeypatch)
    gguf_file = base_gguf(tmp_path)
    with pytest.raises(UsageError, match=r"model.name_or_path='.*base.gguf' has no chat template"):
        PPOTrainer(parse_config(config_file(tmp_path, str(gguf_file))))
    assert not (tmp_path / "run").exists()


def test_a_task_runs_on_a_base_model_with_plain_text_prompts(tmp_path, caplog):
    """The task's config as an instruct model would take it (the chat template on, an answer start
    continued as the assistant's turn) on a model without a chat template: the prompts are the
    question, the instruction and the answer start as plain text, logged; a step runs, and generate
    answers the held-out items in the same plain text."""
    task = {
        "task_name": "chain_sum",
        "task_config": SMALL,
        "task_size": 8,
        "task_eval_size": 2,
        "task_answer_start": "<answer>",
    }
    path = config_file(tmp_path, str(TINY / "model"), task=task)
    with caplog.at_level(logging.WARNING, logger="hydrappo"):
        trainer = PPOTrainer(parse_config(path))
    # said once, though both splits are formatted (tasks/reasoning_gym.py: prompt_set)
    assert caplog.text.count("no chat template (a base model): the task's prompts are plain text") == 1
    assert "then the answer start '<answer>'" in caplog.text
    instruction = trainer.config.task.task_instruction
    for prompts in (trainer.inputs.prompts, trainer.inputs.eval_prompts):
        for prompt in prompts:
            assert isinstance(prompt, str) and prompt.endswith(f"\n\n{instruction}\n<answer>")
    question = trainer.inputs.task.items()[0][0][1]["question"]
    assert trainer.inputs.prompts[0] == f"{question}\n\n{instruction}\n<answer>"
    assert trainer.held_out.prompts.formatted == trainer.inputs.eval_prompts  # the text the model continues
    history = trainer.train()
    assert history[-1]["step"] == 1 and 0.0 <= history[-1]["env/reward/chain_sum"] <= 1.0
    # generate answers the run's held-out items as the run rendered them
    from hydrappo.evaluation.compare import generate

    (rows,) = generate(tmp_path / "run", no_base=True).values()
    assert [row["prompt"] for row in rows] == trainer.inputs.eval_prompts
