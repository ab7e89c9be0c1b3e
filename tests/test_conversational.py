"""TRL's conversational format (prompts.py): a prompt column of message lists goes through the
chat template for generation; reward functions in TRL's convention receive `prompts` as the
message lists and `completions` as [{"role": "assistant", "content": text}], as TRL's
GRPOTrainer passes them; functions in trlX's convention keep receiving text."""

import copy
import json
import re

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from hydrappo import PPOTrainer
from hydrappo.data import DataError, load_prompt_table, tokenize_prompts
from hydrappo.rewards import FunctionReward

from runs import TINY

PROMPTS = [json.loads(line)["prompt"] for line in (TINY / "prompts.jsonl").read_text().splitlines()]
# A chat template over the tiny vocabulary: a turn is its role's word and its content.
TEMPLATE = (
    "{% for m in messages %}{{ {'system': 'n0', 'user': 'n1', 'assistant': 'n2'}[m['role']] }} {{ m['content'] }} "
    "{% endfor %}{% if add_generation_prompt %}n3{% endif %}"
)


def tokenizer_with_template():
    tokenizer = AutoTokenizer.from_pretrained(TINY / "model")
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def conversation(i: int) -> list[dict]:
    """Prompt i as a user turn; every third also starts the answer (a final assistant turn, continued)."""
    turns = [{"role": "user", "content": PROMPTS[i]}]
    return turns + [{"role": "assistant", "content": "g1"}] if i % 3 == 0 else turns


ROWS = [{"prompt": conversation(i), "answer": PROMPTS[i].split()[-1], "row": i} for i in range(24)]


# Written as TRL's documentation writes a reward function for the conversational format: the
# completion's text is completion[0]["content"].
def starts_with_good_word(completions, **kwargs):
    contents = [completion[0]["content"] for completion in completions]
    return [1.0 if re.match(r"^g\d", content) else 0.0 for content in contents]


CALLS: list[tuple] = []


def conversational_accuracy(prompts, completions, answer, row, **kwargs):
    CALLS.append(("TRL", copy.deepcopy(prompts), copy.deepcopy(completions), list(answer), list(row)))
    prompts[0].clear()  # a function that changes its arguments changes nothing else
    return [1.0 if a in c[0]["content"] else 0.0 for c, a in zip(completions, answer)]


def trlx_style(samples, prompts, outputs, row, **kwargs):
    CALLS.append(("trlX", list(samples), list(prompts), list(outputs), list(row)))
    return [0.0] * len(samples)


def test_message_lists_are_formatted_with_the_chat_template():
    tokenizer = tokenizer_with_template()
    prompts = tokenize_prompts([conversation(1), conversation(3)], tokenizer, 16)
    assert prompts.formatted == [f"n1 {PROMPTS[1]} n3", f"n1 {PROMPTS[3]} n2 g1"]  # the last continued, no n3
    assert prompts.texts == prompts.formatted and prompts.messages == [conversation(1), conversation(3)]
    # The template wrote what the model reads: no special tokens added on top (the tiny tokenizer adds none anyway).
    assert prompts.input_ids == [tokenizer(text, add_special_tokens=False).input_ids for text in prompts.formatted]
    system = tokenize_prompts([conversation(1)], tokenizer, 16, apply_chat_template=True, system_prompt="n9")
    assert system.formatted == [f"n0 n9 n1 {PROMPTS[1]} n3"]
    with pytest.raises(DataError, match="the prompts are message lists, which need the tokenizer's chat template"):
        tokenize_prompts([conversation(1)], AutoTokenizer.from_pretrained(TINY / "model"), 16)


def test_trl_convention_gets_messages_and_trlx_gets_text():
    formatted = [f"n1 {PROMPTS[1]} n3", f"n1 {PROMPTS[3]} n2 g1"]
    messages, outputs = [conversation(1), conversation(3)], [" g2 n4", " g3"]
    inputs = dict(columns={"answer": ["n4", "x"], "row": [1, 3]}, prompt_messages=messages)
    CALLS.clear()
    FunctionReward(f"{__name__}:conversational_accuracy")(
        [p + o for p, o in zip(formatted, outputs)], formatted, outputs, **inputs
    )
    FunctionReward(f"{__name__}:trlx_style")([p + o for p, o in zip(formatted, outputs)], formatted, outputs, **inputs)
    (_, prompts, completions, _, _), (_, samples, texts, trlx_outputs, _) = CALLS
    assert prompts == [conversation(1), conversation(3)[:1]]  # the continued assistant turn moves to the completion
    assert completions == [[{"role": "assistant", "content": " g2 n4"}], [{"role": "assistant", "content": "g1 g3"}]]
    assert messages == [conversation(1), conversation(3)]  # the function cleared its own copy
    assert texts == formatted and trlx_outputs == outputs and samples == [p + o for p, o in zip(formatted, outputs)]
    assert FunctionReward(f"{__name__}:starts_with_good_word")(formatted, formatted, outputs, **inputs).tolist() == [
        0.0,
        1.0,
    ]


def test_a_prompt_column_holds_text_or_message_lists(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS[:3]))
    prompts, columns = load_prompt_table(str(path))
    assert prompts == [conversation(0), conversation(1), conversation(2)] and columns["row"] == [0, 1, 2]
    path.write_text(json.dumps({"prompt": conversation(1)}) + "\n" + json.dumps({"prompt": "n1 n2"}) + "\n")
    with pytest.raises(DataError, match=r"row 2: the prompt is text while other rows hold message lists"):
        load_prompt_table(str(path))
    path.write_text(json.dumps({"prompt": [{"role": "user", "text": "n1"}]}) + "\n")
    with pytest.raises(
        DataError, match=r"row 1: the prompt holds .* as message 1, not \{'role': text, 'content': text\}"
    ):
        load_prompt_table(str(path))


def test_a_run_on_message_lists_passes_trls_shapes_and_trlxs_text(tmp_path):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY / "model"))
    tokenizer = tokenizer_with_template()
    CALLS.clear()
    trainer = PPOTrainer(
        model,
        processing_class=tokenizer,
        train_dataset=ROWS,
        eval_dataset=ROWS[:6],
        reward_funcs=[starts_with_good_word, conversational_accuracy, trlx_style],
        args={
            "model": {"num_layers_unfrozen": 2},
            "generation": {"max_new_tokens": 4, "samples_per_prompt": 2},
            "ppo": {"batch_size": 8, "mini_batch_size": 4, "ppo_epochs": 1, "advantage_estimator": "grpo"},
            "train": {"output_dir": str(tmp_path / "run"), "total_steps": 1, "save_every": 0, "progress_bar": False},
        },
    )
    for i, row in enumerate(ROWS):
        continued = i % 3 == 0
        expected = tokenizer.apply_chat_template(
            row["prompt"], tokenize=False, add_generation_prompt=not continued, continue_final_message=continued
        )
        assert trainer.ppo_step.prompts.formatted[i] == expected
    history = trainer.train()
    assert "env/reward/starts_with_good_word" in history[-1] and "eval/reward/starts_with_good_word" in history[0]
    assert len(CALLS) == 6  # each function once for the rollouts of step 1 and for the evaluations at steps 0 and 1
    for (_, prompts, completions, answer, rows), (_, samples, texts, outputs, trlx_rows) in zip(
        CALLS[::2], CALLS[1::2]
    ):
        assert rows == trlx_rows
        for prompt, completion, a, i, text, output, sample in zip(
            prompts, completions, answer, rows, texts, outputs, samples
        ):
            assert prompt == [{"role": "user", "content": PROMPTS[i]}] and a == ROWS[i]["answer"]
            start = "g1" if i % 3 == 0 else ""
            assert completion == [{"role": "assistant", "content": start + output}]
            assert text == trainer.ppo_step.prompts.formatted[i] and sample == text + output
