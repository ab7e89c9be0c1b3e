"""The examples' prompt files keep their held-out sets held out: no prompt that trains (the sentiment
prompts, the preference study's new and wide prompts) is one the study scores on (the sentiment
held-out prompts, the other-style prompts)."""

import json

from runs import ROOT

TRAINED = ["sentiment/prompts.jsonl", "preference/new_prompts.jsonl", "preference/wide_prompts.jsonl"]
HELD_OUT = ["sentiment/eval_prompts.jsonl", "preference/other_prompts.jsonl"]


def prompts(name: str) -> list[str]:
    lines = (ROOT / "examples" / name).read_text().splitlines()
    texts = [json.loads(line)["prompt"] for line in lines if line.strip()]
    assert all(isinstance(text, str) and 10 < len(text) < 160 for text in texts), name
    assert len(set(texts)) == len(texts), f"{name} has duplicates"
    return texts


def normalised(text: str) -> str:
    return " ".join(text.lower().split()).rstrip(".")


def test_no_training_prompt_is_a_held_out_one():
    held_out = {normalised(text): name for name in HELD_OUT for text in prompts(name)}
    leaked = [
        (name, text, held_out[normalised(text)])
        for name in TRAINED
        for text in prompts(name)
        if normalised(text) in held_out
    ]
    assert not leaked, leaked


def test_each_prompt_file_holds_distinct_prompts():
    for name in TRAINED + HELD_OUT:
        texts = prompts(name)
        assert texts and len({normalised(text) for text in texts}) == len(texts), name


def test_sentiment_prompt_files():
    train, held_out = prompts("sentiment/prompts.jsonl"), prompts("sentiment/eval_prompts.jsonl")
    assert len(train) >= 300 and len(held_out) == 50
    assert not set(train) & set(held_out)
