"""A multi-turn run (tools, an environment with its own reward) killed after a checkpoint and
resumed ends with the weights and the logged statistics of the run left uninterrupted, bit for
bit: the episodes (their sampling, tool calls and environment states) are the same again."""

import json

import pytest
from transformers import AutoTokenizer

from hydrappo.config import parse_config
from hydrappo.train.ppo import PPOTrainer
from runs import ROOT, TINY, Killed, kill_after_next_save, same_parameters

pytestmark = pytest.mark.slow

FIXTURE = ROOT / "tests" / "fixtures" / "agent_tools.py"
TEMPLATE = (
    "{% for m in messages %}{{ {'system': 'n0', 'user': 'n1', 'assistant': 'n2', 'tool': 'n4'}[m['role']] }} "
    "{{ m['content'] }} <eos> {% endfor %}{% if add_generation_prompt %}n2{% endif %}"
)


def trainer(folder, tokenizer_dir):
    config = parse_config(
        TINY / "config.yaml",
        [
            "--output_dir",
            str(folder),
            "--progress_bar",
            "false",
            "--total_steps",
            "4",
            "--save_every",
            "2",
            "--tokenizer_name_or_path",
            str(tokenizer_dir),
            "--samples_per_prompt",
            "4",
            "--batch_size",
            "8",
            "--mini_batch_size",
            "4",
            "--advantage_estimator",
            "grpo",
            "--stop_token_ids",
            *map(str, range(20, 44)),
            "--environment_factory",
            f"{FIXTURE}:Shelf",
            "--tool_call_parser",
            f"{FIXTURE}:parse",
            "--max_tool_calling_iterations",
            "2",
            "--max_episode_tokens",
            "40",
        ],
    )
    return PPOTrainer(config, config_dir=TINY)


def test_an_agent_run_resumes_exactly(tmp_path, monkeypatch):
    tokenizer = AutoTokenizer.from_pretrained(TINY / "model")
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(tmp_path / "tokenizer")
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
