"""A multi-turn run (tools, an environment with its own reward) killed after a checkpoint and
resumed ends with the weights and the logged statistics of the run left uninterrupted, bit for
bit: the episodes (their sampling, tool calls and environment states) are the same again."""

import json

import pytest

from hydrappo.config import parse_config
from hydrappo.train.ppo import PPOTrainer
from runs import TINY, Killed, agent_run_options, kill_after_next_save, same_parameters, save_tiny_tool_tokenizer

pytestmark = pytest.mark.slow


def trainer(folder, tokenizer_dir):
    options = ["--progress_bar", "false", "--total_steps", "4", "--save_every", "2"]
    options += ["--batch_size", "8", "--mini_batch_size", "4", *agent_run_options(tokenizer_dir)]
    config = parse_config(TINY / "config.yaml", ["--output_dir", str(folder), *options])
    return PPOTrainer(config, config_dir=TINY)


def test_an_agent_run_resumes_exactly(tmp_path, monkeypatch):
    save_tiny_tool_tokenizer(tmp_path / "tokenizer")
    straight = trainer(tmp_path / "straight", tmp_path / "tokenizer")
    history = straight.train()
    assert any(step.get("agent/tool_rounds_mean", 0) > 0 for step in history) and "env/reward/Shelf" in history[-1]

    first = trainer(tmp_path / "resumed", tmp_path / "tokenizer")
    kill_after_next_save(first, monkeypatch)
    with pytest.raises(Killed):
        first.train()
    monkeypatch.undo()
    resumed = trainer(tmp_path / "resumed", tmp_path / "tokenizer")
    resumed.train(resume=True)
    same_parameters(straight.hydra, resumed.hydra)
    lines = [json.loads(line) for line in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()]
    again = {line["step"]: line for line in lines}
    for step in history:
        for key in ("env/reward_mean", "agent/tool_calls_mean", "env/reward/Shelf"):
            if key in step:
                assert again[step["step"]][key] == step[key], (step["step"], key)
