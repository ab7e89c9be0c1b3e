"""`processing_class` (TRL's name of the tokenizer given in Python) is the tokenizer a trainer uses,
whatever names the model: a path, a Hub id or a loaded PreTrainedModel, in PPOTrainer, RewardTrainer
and SFTTrainer. The tiny example's own tokenizer has no chat template, so a run that renders its
prompts with one (data.apply_chat_template) works only with the given tokenizer. A tokenizer that
cannot serve the run is refused with what to do: no chat template where one is needed (refused
before any model loads), a vocabulary larger than the model's embeddings, special ids outside them."""

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from hydrappo import PPOTrainer, RewardTrainer, SFTTrainer
from hydrappo.config import ConfigError
from hydrappo.errors import UsageError
from hydrappo.storage.models import check_tokenizer_fits

from runs import AGENT_FIXTURE, TINY, TINY_TOOL_TEMPLATE, write_pairs
from tiny import tiny_tokenizer

ROWS = [json.loads(line) for line in (TINY / "prompts.jsonl").read_text().splitlines()]
SFT = [{"prompt": row["prompt"], "response": "g1 g2"} for row in ROWS]
CONVERSATIONS = [{"prompt": [{"role": "user", "content": row["prompt"]}]} for row in ROWS]
HUB_ID = "tiny-org/tiny-llama"


def no_reward(completions, **kwargs):
    return [0.0] * len(completions)


def chat_tokenizer():
    """The tiny model's tokenizer with a chat template, which its own (loaded from the path) lacks."""
    tokenizer = AutoTokenizer.from_pretrained(TINY / "model")
    tokenizer.chat_template = TINY_TOOL_TEMPLATE
    return tokenizer


def options(tmp_path: Path, stage: str = "ppo", **data) -> dict:
    args = {
        "model": {"random_init": True, "num_layers_unfrozen": 2},
        "data": {"apply_chat_template": True, **data},
        "train": {"output_dir": str(tmp_path / "run"), "progress_bar": False},
    }
    if stage == "ppo":
        args["generation"] = {"max_new_tokens": 4}
        args["ppo"] = {"batch_size": 8, "mini_batch_size": 4}
    else:
        args["data"]["eval_fraction"] = 0.2
    return args


def rendered(tokenizer, prompt: str) -> list[int]:
    """The ids of a text prompt as a user turn of `tokenizer`'s chat template."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def ppo(model, tmp_path, tokenizer, train_dataset=ROWS, **data):
    return PPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=no_reward,
        train_dataset=train_dataset,
        args=options(tmp_path, **data),
    )


def test_ppo_uses_the_given_tokenizer_with_a_model_path(tmp_path):
    tokenizer = chat_tokenizer()
    trainer = ppo(str(TINY / "model"), tmp_path, tokenizer)
    assert trainer.tokenizer is tokenizer
    assert trainer.ppo_step.prompts.input_ids[0] == rendered(tokenizer, ROWS[0]["prompt"])


def test_ppo_uses_the_given_tokenizer_with_a_loaded_model(tmp_path):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY / "model"))
    tokenizer = chat_tokenizer()
    trainer = ppo(model, tmp_path, tokenizer)
    assert trainer.hydra.model is model and trainer.tokenizer is tokenizer
    assert trainer.ppo_step.prompts.input_ids[0] == rendered(tokenizer, ROWS[0]["prompt"])


def add_snapshot(cache: Path, folder: Path, commit: str = "1" * 40) -> None:
    """`folder`'s files as huggingface_hub stores a download of HUB_ID at main (tests/storage/test_hub_ids.py)."""
    repo = cache / f"models--{HUB_ID.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for file in sorted(folder.iterdir()):
        blob = repo / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
        blob.write_bytes(file.read_bytes())
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)


def test_ppo_uses_the_given_tokenizer_with_a_hub_id(tmp_path, monkeypatch):
    folder = tmp_path / "tiny"
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY / "model")).save_pretrained(folder)
    AutoTokenizer.from_pretrained(TINY / "model").save_pretrained(folder)  # its own: no chat template
    add_snapshot(tmp_path / "hub", folder)
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tokenizer = chat_tokenizer()
    trainer = ppo(HUB_ID, tmp_path, tokenizer)
    assert trainer.tokenizer is tokenizer and trainer.config.model.name_or_path == HUB_ID
    assert trainer.ppo_step.prompts.input_ids[0] == rendered(tokenizer, ROWS[0]["prompt"])


def test_sft_uses_the_given_tokenizer_with_a_model_path(tmp_path):
    tokenizer = chat_tokenizer()
    trainer = SFTTrainer(
        model=str(TINY / "model"), processing_class=tokenizer, train_dataset=SFT, args=options(tmp_path, "sft")
    )
    assert trainer.tokenizer is tokenizer
    prompts = [SFT[i]["prompt"] for i in range(len(SFT))]
    assert rendered(tokenizer, prompts[0]) in trainer.train_set[0] + trainer.eval_set[0]


def test_the_reward_stage_uses_the_given_tokenizer_with_a_model_path(tmp_path):
    write_pairs(tmp_path / "pairs.jsonl")
    tokenizer = chat_tokenizer()
    trainer = RewardTrainer(
        model=str(TINY / "model"),
        processing_class=tokenizer,
        train_dataset=tmp_path / "pairs.jsonl",
        args=options(tmp_path, "reward"),
    )
    assert trainer.tokenizer is tokenizer
    pairs = trainer.train_pairs
    assert pairs.prompt_ids[0] == rendered(tokenizer, pairs.prompts[0])


def refuse_loading(monkeypatch):
    """A test of a refusal before any model loads: loading one fails the test."""

    def load(*args, **kwargs):
        raise AssertionError("a model was loaded for a run that is refused")

    monkeypatch.setattr("hydrappo.train.harness.build_hydra", load)


@pytest.mark.parametrize(
    "data, dataset, why",
    [
        ({}, ROWS, "data.apply_chat_template is set"),
        (
            {"apply_chat_template": False},
            CONVERSATIONS,
            "the prompts of data.prompts \\(train_dataset\\) are message lists",
        ),
    ],
)
def test_ppo_refuses_a_tokenizer_without_the_chat_template_it_needs(tmp_path, monkeypatch, data, dataset, why):
    refuse_loading(monkeypatch)
    with pytest.raises(UsageError, match=f"processing_class: the tokenizer has no chat template, and {why}"):
        ppo(str(TINY / "model"), tmp_path, AutoTokenizer.from_pretrained(TINY / "model"), dataset, **data)


def test_an_agent_run_refuses_a_tokenizer_without_a_chat_template(tmp_path, monkeypatch):
    refuse_loading(monkeypatch)
    args = options(tmp_path, apply_chat_template=False)
    with pytest.raises(UsageError, match="no chat template, and multi-turn episodes"):
        PPOTrainer(
            model=str(TINY / "model"),
            processing_class=AutoTokenizer.from_pretrained(TINY / "model"),
            reward_funcs=no_reward,
            train_dataset=ROWS,
            tools=[f"{AGENT_FIXTURE}:lookup"],
            args=args,
        )


def test_sft_refuses_a_tokenizer_without_a_chat_template(tmp_path, monkeypatch):
    refuse_loading(monkeypatch)
    with pytest.raises(UsageError, match="no chat template, and data.apply_chat_template is set"):
        SFTTrainer(
            model=str(TINY / "model"),
            processing_class=AutoTokenizer.from_pretrained(TINY / "model"),
            train_dataset=SFT,
            args=options(tmp_path, "sft"),
        )


def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused(tmp_path):
    tokenizer = tiny_tokenizer()  # 96 tokens; the tiny example embeds 60
    tokenizer.chat_template = TINY_TOOL_TEMPLATE
    with pytest.raises(
        UsageError, match=r"processing_class: the tokenizer has 96 tokens and the model .* embeds only 60"
    ):
        ppo(str(TINY / "model"), tmp_path, tokenizer)


def test_special_token_ids_outside_the_embeddings_are_refused():
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY / "model"))

    class Tokenizer:  # as small as the model's, but its padding id lies past the embedding rows
        pad_token_id, eos_token_id, bos_token_id, unk_token_id = 75, 2, 1, None

        def __len__(self):
            return 60

    with pytest.raises(UsageError, match=r"special token id\(s\) pad_token_id=75 lie outside the model's 60"):
        check_tokenizer_fits(model, Tokenizer())
    check_tokenizer_fits(model, AutoTokenizer.from_pretrained(TINY / "model"))  # its own fits


def test_what_is_not_a_tokenizer_or_a_second_tokenizer_is_refused(tmp_path, monkeypatch):
    refuse_loading(monkeypatch)
    with pytest.raises(UsageError, match="processing_class: a str is not a transformers tokenizer"):
        ppo(str(TINY / "model"), tmp_path, str(TINY / "model"))
    args = options(tmp_path)
    args["model"]["tokenizer_name_or_path"] = str(TINY / "model")
    with pytest.raises(ConfigError, match="processing_class and model.tokenizer_name_or_path=.* give one of them"):
        PPOTrainer(
            model=str(TINY / "model"),
            processing_class=chat_tokenizer(),
            reward_funcs=no_reward,
            train_dataset=ROWS,
            args=args,
        )
