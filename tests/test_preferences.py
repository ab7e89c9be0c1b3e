"""The one preference reader (preferences.py): TRL's standard, conversational and implicit-prompt
formats, columns renamed by option, and each kind of bad row with its message."""

import json
import logging

import pytest
from transformers import AutoTokenizer

from hydrappo.config import DPODataArgs, PreferenceDataArgs
from hydrappo.errors import DataError
from hydrappo.preferences import load_preference_pairs, prompt_groups, read_preference_table, shared_text_prompt

from runs import TINY, TINY_TOOL_TEMPLATE


@pytest.fixture(scope="module")
def tokenizer():
    tokenizer = AutoTokenizer.from_pretrained(TINY / "model")
    tokenizer.chat_template = TINY_TOOL_TEMPLATE  # a turn: its role's word, its content, <eos>
    return tokenizer


def write(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_standard_rows(tmp_path, tokenizer):
    path = write(tmp_path / "p.jsonl", [{"prompt": "n5 n6", "chosen": "g1 g2", "rejected": "n7"}])
    pairs = load_preference_pairs(path, tokenizer, DPODataArgs(append_eos=True))
    assert pairs.prompt_ids == [ids(tokenizer, "n5 n6")]
    assert pairs.chosen_ids == [ids(tokenizer, "g1 g2") + [tokenizer.eos_token_id]]
    assert pairs.rejected_ids == [ids(tokenizer, "n7") + [tokenizer.eos_token_id]]


def test_conversational_rows_go_through_the_chat_template(tmp_path, tokenizer):
    row = {
        "prompt": [{"role": "user", "content": "n5 n6"}],
        "chosen": [{"role": "assistant", "content": "g1 g2"}],
        "rejected": [{"role": "assistant", "content": "n7"}],
    }
    table = read_preference_table(write(tmp_path / "c.jsonl", [row]), DPODataArgs())
    assert table.format == "conversational"
    pairs = load_preference_pairs(None, tokenizer, DPODataArgs(), table=table)
    # prompt: "n1 n5 n6 <eos> n2" (the user turn, then the generation prompt); the answer: its turn's
    # rest, " g1 g2 <eos>", with no second EOS
    assert pairs.prompt_ids == [ids(tokenizer, "n1 n5 n6 <eos> n2")]
    assert pairs.chosen_ids == [ids(tokenizer, "g1 g2 <eos>")]
    assert pairs.rejected_ids == [ids(tokenizer, "n7 <eos>")]


def test_implicit_prompts_are_the_shared_beginning(tmp_path, tokenizer):
    assert shared_text_prompt("n5 n6 g1 g2", "n5 n6 n7") == "n5 n6"  # cut back before the space
    path = write(tmp_path / "i.jsonl", [{"chosen": "n5 n6 g1 g2", "rejected": "n5 n6 n7"}])
    table = read_preference_table(path, DPODataArgs())
    assert table.format == "implicit prompt" and table["prompt"] == ["n5 n6"]
    pairs = load_preference_pairs(None, tokenizer, DPODataArgs(append_eos=False), table=table)
    assert pairs.prompt_ids == [ids(tokenizer, "n5 n6")] and pairs.chosen_ids == [ids(tokenizer, "g1 g2")]
    # the same as message lists: the shared first turns are the prompt
    user = {"role": "user", "content": "n5"}
    rows = [
        {
            "chosen": [user, {"role": "assistant", "content": "g1"}],
            "rejected": [user, {"role": "assistant", "content": "n7"}],
        }
    ]
    table = read_preference_table(write(tmp_path / "ic.jsonl", rows), DPODataArgs())
    assert table["prompt"] == [[user]] and table.conversational
    pairs = load_preference_pairs(None, tokenizer, DPODataArgs(), table=table)
    assert pairs.chosen_ids == [ids(tokenizer, "g1 <eos>")]
    assert prompt_groups(table, DPODataArgs()) == [json.dumps([user], sort_keys=True)]


def test_columns_renamed_by_option(tmp_path, tokenizer):
    path = write(tmp_path / "r.jsonl", [{"question": "n5", "good": "g1", "bad": "n7"}])
    data = DPODataArgs(prompt_column="question", chosen_column="good", rejected_column="bad", append_eos=False)
    pairs = load_preference_pairs(path, tokenizer, data)
    assert pairs.prompt_ids == [ids(tokenizer, "n5")] and pairs.rejected_ids == [ids(tokenizer, "n7")]
    with pytest.raises(DataError, match="data.chosen_column"):
        read_preference_table(path, DPODataArgs(prompt_column="question"))
    with pytest.raises(DataError, match="no column 'query'"):
        read_preference_table(path, DPODataArgs(prompt_column="query", chosen_column="good", rejected_column="bad"))


def test_bad_rows_are_skipped_and_counted(tmp_path, tokenizer, caplog):
    rows = [
        {"prompt": "n1", "chosen": "g1", "rejected": "n2"},
        {"prompt": "n1", "chosen": " ", "rejected": "n2"},  # an empty answer
        {"prompt": "n2", "chosen": "g1", "rejected": "g1"},  # chosen equal to rejected
        {"prompt": "n3 n4 n5 n6", "chosen": "g1", "rejected": "n2"},  # no room under max_length 4
        {"prompt": "n4", "chosen": "g1 g2 g3 g4", "rejected": "n2"},
    ]
    path = write(tmp_path / "bad.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger="hydrappo"):
        table = read_preference_table(path, DPODataArgs())
        pairs = load_preference_pairs(None, tokenizer, DPODataArgs(max_length=4, append_eos=False), table=table)
    assert len(table["chosen"]) == 3
    assert table.skipped == {"an empty answer": [2], "chosen equal to rejected": [3]}
    assert "2 of 5 rows skipped" in caplog.text and "an empty answer (row 2)" in caplog.text
    assert "leaves no room" in caplog.text
    usable = pairs.usable()
    assert len(usable) == 2  # the long prompt's pair is left out
    assert usable.chosen_ids[1] == ids(tokenizer, "g1 g2 g3")  # cut to what the prompt leaves: 4 - 1
    with pytest.raises(DataError, match="every prompt is at least data.max_length"):
        load_preference_pairs(None, tokenizer, DPODataArgs(max_length=1), table=table)


@pytest.mark.parametrize(
    "rows, message",
    [
        ([{"prompt": "n1", "chosen": None, "rejected": "n2"}], "row 1 has a NoneType chosen"),
        ([{"prompt": "n1", "chosen": 3, "rejected": "n2"}], "row 1 has a int chosen"),
        ([{"prompt": "n1", "chosen": "g1", "rejected": [{"role": "assistant", "content": "n2"}]}], "the same way"),
        (
            [
                {"prompt": [{"role": "user", "content": "n1"}], "chosen": "g1", "rejected": "n2"},
            ],
            "answers as text",
        ),
        ([{"prompt": "n1", "chosen": [{"role": "assistant"}], "rejected": [{"role": "assistant"}]}], "message 1"),
        ([{"prompt": "n1", "chosen": "", "rejected": ""}], "none of its 1 rows is a usable pair"),
        ([{"chosen": "g1", "rejected": "n2"}], "none of its 1 rows"),  # implicit, nothing shared
    ],
)
def test_malformed_tables_name_the_row(tmp_path, rows, message):
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(DataError, match=message):
        read_preference_table(str(path), DPODataArgs())


def test_the_reward_stage_keeps_whole_texts_and_margins(tmp_path, tokenizer):
    path = write(tmp_path / "w.jsonl", [{"chosen": "n5 g1", "rejected": "n5 n7", "m": 0.5}])
    data = PreferenceDataArgs(prompt_column=None, margin_column="m", append_eos=False)
    table = read_preference_table(path, data)
    assert table.format == "whole texts" and table["m"] == [0.5]
    pairs = load_preference_pairs(None, tokenizer, data, table=table)
    assert pairs.prompt_ids == [[]] and pairs.margins == [0.5]


def _cached_dataset_repo(cache, repo_id: str, rows: list[dict], commit: str = "4" * 40) -> None:
    """A dataset repo in the Hub cache as `hf download --repo-type dataset` leaves it: data/train-*.jsonl
    under snapshots/<commit>, refs/main naming the commit (files, not blob links: huggingface_hub reads both)."""
    repo = cache / f"datasets--{repo_id.replace('/', '--')}"
    (repo / "snapshots" / commit / "data").mkdir(parents=True)
    write(repo / "snapshots" / commit / "data" / "train-00000-of-00001.jsonl", rows)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)


def test_a_hub_id_in_the_cache_reads_offline_in_each_format(tmp_path, tokenizer, monkeypatch, no_network):
    """TRL users name preference datasets by Hub id; offline, the repo's files in HF_HUB_CACHE are read
    (datasets' own offline mode knows only datasets it loaded before) and nothing is asked of the network."""
    cache = tmp_path / "hub"
    _cached_dataset_repo(cache, "pref-org/standard", [{"prompt": "n5 n6", "chosen": "g1 g2", "rejected": "n7"}])
    conversation = {
        "prompt": [{"role": "user", "content": "n5 n6"}],
        "chosen": [{"role": "assistant", "content": "g1 g2"}],
        "rejected": [{"role": "assistant", "content": "n7"}],
    }
    _cached_dataset_repo(cache, "pref-org/conversational", [conversation])
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))

    pairs = load_preference_pairs("pref-org/standard", tokenizer, DPODataArgs(append_eos=False))
    assert pairs.prompt_ids == [ids(tokenizer, "n5 n6")] and pairs.chosen_ids == [ids(tokenizer, "g1 g2")]
    table = read_preference_table("pref-org/conversational", DPODataArgs())
    assert table.format == "conversational"
    pairs = load_preference_pairs(None, tokenizer, DPODataArgs(), table=table)
    assert pairs.prompt_ids == [ids(tokenizer, "n1 n5 n6 <eos> n2")] and pairs.rejected_ids == [
        ids(tokenizer, "n7 <eos>")
    ]

    with pytest.raises(
        DataError, match="data.train_file: 'pref-org/absent' does not exist here .* local datasets cache"
    ):
        read_preference_table("pref-org/absent", DPODataArgs())
    assert no_network == []  # offline: the caches were read, the Hub never asked
