"""A multi-turn run whose tool fails ends with a message that names the tool, the step and the
call (no traceback), and keeps the checkpoints written before; with agent.on_tool_error: result
the same failure is a tool turn the model reads, and the run goes on. And a tiny multi-turn run
trains end to end through the command line."""

import json
import subprocess
import sys

import pytest
import yaml

from runs import AGENT_FIXTURE, ROOT, TINY, save_tiny_tool_tokenizer

pytestmark = pytest.mark.slow


def write_run(tmp, tool: str, **agent):
    save_tiny_tool_tokenizer(tmp / "tokenizer")
    (tmp / "tools.py").write_text(
        AGENT_FIXTURE.read_text()
        + f'''

def broken(word: str) -> str:
    """Fails once the run has written its first checkpoint (from step 2 on).

    Args:
        word: The word.
    """
    import os
    if os.path.isdir({str(tmp / "run" / "checkpoint-1")!r}):
        raise RuntimeError("the index is gone")
    return "g1"
'''
    )
    config = yaml.safe_load((TINY / "config.yaml").read_text())
    config["model"].update(name_or_path=str(TINY / "model"), tokenizer_name_or_path=str(tmp / "tokenizer"))
    config["generation"].update(stop_token_ids=list(range(20, 44)), samples_per_prompt=4, generation_batch_size=16)
    config["ppo"].update(batch_size=16, mini_batch_size=8, ppo_epochs=1, advantage_estimator="grpo")
    config["reward"]["reward_fn"] = str(TINY / "reward.py") + ":reward_fn"
    config["data"]["prompts"] = str(TINY / "prompts.jsonl")
    config["train"].update(output_dir=str(tmp / "run"), total_steps=3, save_every=1)
    # The parser: a turn with a word of n5..n29 calls `tool` (the rename keeps the fixture's rule).
    (tmp / "tools.py").write_text((tmp / "tools.py").read_text().replace('{"name": "lookup"', f'{{"name": "{tool}"'))
    config["agent"] = {
        "tools": [f"{tmp / 'tools.py'}:{tool}"],
        "tool_call_parser": f"{tmp / 'tools.py'}:parse",
        "max_tool_calling_iterations": 1,
        "max_episode_tokens": 40,
        **agent,
    }
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def train(path):
    return subprocess.run(
        [sys.executable, "-m", "hydrappo", "train", str(path), "--progress_bar", "false"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )


def test_a_failing_tool_ends_the_run_with_its_message_and_keeps_the_checkpoints(tmp_path):
    done = train(write_run(tmp_path, "broken"))
    assert done.returncode == 1, done.stderr[-2000:]
    assert (
        "tool 'broken' at step 2, called with {'word': " in done.stderr
        and "raised RuntimeError: the index is gone" in done.stderr
    )
    assert "agent.on_tool_error: result" in done.stderr and "Traceback" not in done.stderr
    assert (tmp_path / "run" / "checkpoint-1").is_dir()


def test_with_on_tool_error_result_the_failure_is_a_tool_turn_and_training_goes_on(tmp_path):
    done = train(write_run(tmp_path, "broken", on_tool_error="result"))
    assert done.returncode == 0, done.stderr[-2000:]
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert (
        steps[-1]["step"] == 3
        and sum(s["agent/failed_calls_mean"] for s in steps if "agent/failed_calls_mean" in s) > 0
    )
    rates = [s["agent/valid_call_rate"] for s in steps if "agent/valid_call_rate" in s]
    assert rates and all(rate == 1.0 for rate in rates)  # the failed calls were valid calls: the tool failed
