"""tools/lab/race_trl.py without TRL installed: its option checks, and the reward-model adapter through which
TRL's PPOTrainer gets the sentiment example's reward function."""

import importlib.util
import sys

import pytest
import torch
from transformers import AutoTokenizer

from runs import ROOT

sys.path.insert(0, str(ROOT / "tools" / "lab"))

import race_trl  # noqa: E402


def test_a_bad_option_is_named_with_its_fix(capsys):
    with pytest.raises(SystemExit) as stopped:
        race_trl.parse_args(["--sides", "hydrappo", "--mini-batch", "3"])
    assert stopped.value.code == 2
    assert "--mini-batch=3 must divide --batch=8; use a divisor of 8" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        race_trl.parse_args(["--sides", "hydrappo", "trl2"])
    assert "--sides=hydrappo trl2 names trl2, which is no side" in capsys.readouterr().err


def test_without_trl_the_message_names_the_pip_command(capsys, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        race_trl.importlib.util, "find_spec", lambda name, *rest: None if name == "trl" else find_spec(name, *rest)
    )
    with pytest.raises(SystemExit) as stopped:
        race_trl.parse_args([])  # every side by default, TRL among them
    message = capsys.readouterr().err
    assert stopped.value.code == 2 and "Traceback" not in message
    assert "pip install trl==1.12.0" in message and "--sides hydrappo hydrappo-full" in message
    assert race_trl.parse_args(["--sides", "hydrappo", "hydrappo-full"]).sides == ["hydrappo", "hydrappo-full"]


def trl_get_reward(model, query_responses, pad_token_id: int, context_length: int) -> torch.Tensor:
    """The scores TRL 1.12's PPOTrainer reads off a reward model: trl.experimental.utils.get_reward, its
    calling convention restated (pads masked to id 0, the score at the last token before the response's
    first pad)."""
    attention_mask = query_responses != pad_token_id
    output = getattr(model, model.base_model_prefix)(
        input_ids=torch.masked_fill(query_responses, ~attention_mask, 0),
        attention_mask=attention_mask,
        position_ids=attention_mask.cumsum(1) - attention_mask.long(),
        return_dict=True,
        output_hidden_states=True,
        use_cache=False,
    )
    logits = model.score(output.hidden_states[-1])
    is_pad = query_responses[:, context_length:] == pad_token_id
    first_pad = torch.where(is_pad.any(1), is_pad.int().argmax(1), is_pad.shape[1])
    return logits[torch.arange(logits.shape[0]), first_pad - 1 + context_length].squeeze(-1)


def test_the_reward_adapter_gives_trl_the_reward_function_s_score_of_each_response():
    tokenizer = AutoTokenizer.from_pretrained(ROOT / "examples" / "tiny" / "model")  # word 'nK' is token K + 4
    tokenizer.add_special_tokens({"pad_token": "[PAD]"})  # as the race gives TRL a pad of its own
    pad = tokenizer.pad_token_id

    def reward_fn(samples, prompts, outputs):  # the prompt's words count half, to see both were decoded
        return [len(response.split()) + 0.5 * len(prompt.split()) for prompt, response in zip(prompts, outputs)]

    adapter = race_trl.vader_reward_model(tokenizer, reward_fn, response_length=4)
    query_responses = torch.tensor(
        [
            [pad, 5, 6, 7, 8, 9, 10],  # a left-padded prompt 'n1 n2', the whole response 'n3 n4 n5 n6'
            [4, 5, 6, 11, 12, pad, pad],  # prompt 'n0 n1 n2', the response cut after 'n7 n8' (TRL's truncation)
        ]
    )
    scores = trl_get_reward(adapter, query_responses, pad, context_length=3)
    assert scores.tolist() == [4 + 0.5 * 2, 2 + 0.5 * 3]  # exact: small integers and halves in float32
    assert adapter.backbone.seconds > 0  # its time is counted, to be reported apart
