import json
import logging

import pytest
import torch
from datasets import Dataset
from tokenizers import processors

from hydrappo.data import (
    DataError,
    PromptSampler,
    format_prompt,
    left_pad,
    load_prompt_texts,
    tokenize_prompts,
)

from tiny import tiny_tokenizer

PROMPTS = ["w1 w2 w3", "w4, with a comma", 'w5 "quoted"']


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def write_prompts(path, fmt, prompts, column="prompt"):
    if fmt == "jsonl":
        write_jsonl(path, [{column: p, "id": i} for i, p in enumerate(prompts)])
    elif fmt == "json":
        path.write_text(json.dumps([{column: p} for p in prompts]))
    elif fmt == "csv":
        Dataset.from_dict({"id": list(range(len(prompts))), column: prompts}).to_csv(str(path), index=False)
    elif fmt == "parquet":
        Dataset.from_dict({column: prompts, "id": list(range(len(prompts)))}).to_parquet(str(path))
    elif fmt == "txt":
        path.write_text("\n".join(prompts) + "\n")
    return str(path)


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv", "parquet", "txt"])
def test_load_each_format(tmp_path, fmt):
    path = write_prompts(tmp_path / f"prompts.{fmt}", fmt, PROMPTS, column="question")
    assert load_prompt_texts(path, column="question") == PROMPTS  # txt ignores the column


def test_load_directory_in_sorted_order_skipping_other_files(tmp_path):
    write_prompts(tmp_path / "b.csv", "csv", ["w2"])
    write_prompts(tmp_path / "a.jsonl", "jsonl", ["w1"])
    (tmp_path / "sub").mkdir()
    write_prompts(tmp_path / "sub" / "c.txt", "txt", ["w3", "w4"])
    (tmp_path / "README.md").write_text("not prompts")
    write_prompts(tmp_path / ".hidden.jsonl", "jsonl", ["never"])
    assert load_prompt_texts(str(tmp_path)) == ["w1", "w2", "w3", "w4"]


def test_load_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_prompt_texts(str(tmp_path / "nope.jsonl"))
    (tmp_path / "notes.md").write_text("x")
    with pytest.raises(DataError, match="no prompt files"):
        load_prompt_texts(str(tmp_path))
    with pytest.raises(DataError, match="unsupported prompt file type '.md'"):
        load_prompt_texts(str(tmp_path / "notes.md"))


def test_missing_column_lists_the_columns(tmp_path):
    path = write_prompts(tmp_path / "p.jsonl", "jsonl", PROMPTS, column="text")
    with pytest.raises(DataError, match=r"no column 'prompt'; columns present: text, id"):
        load_prompt_texts(path)


def test_bad_rows_are_named(tmp_path):
    path = tmp_path / "p.jsonl"
    write_jsonl(path, [{"prompt": "w1"}, {"prompt": "w2"}, {"prompt": "  "}])
    with pytest.raises(DataError, match="row 3 has an empty prompt"):
        load_prompt_texts(str(path))
    write_jsonl(path, [{"prompt": "w1"}, {"prompt": None}])
    with pytest.raises(DataError, match="row 2 has a NoneType prompt"):
        load_prompt_texts(str(path))
    txt = tmp_path / "p.txt"
    txt.write_text("w1\n\nw2\n")
    with pytest.raises(DataError, match="line 2 has an empty prompt"):
        load_prompt_texts(str(txt))


def test_empty_dataset(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("prompt\n")
    with pytest.raises(DataError, match="empty"):
        load_prompt_texts(str(path))


def test_left_truncation_keeps_the_end_and_warns_once(caplog):
    tokenizer = tiny_tokenizer()
    texts = ["w1 w2 w3 w4 w5 w6", "w7 w8", "w9 w10 w11 w12 w13"]
    with caplog.at_level(logging.WARNING, logger="hydrappo"):
        prompts = tokenize_prompts(texts, tokenizer, max_prompt_length=3)
    ids = tokenizer.convert_tokens_to_ids
    assert prompts.input_ids == [ids(["w4", "w5", "w6"]), ids(["w7", "w8"]), ids(["w11", "w12", "w13"])]
    assert prompts.texts == texts and prompts.formatted == texts and len(prompts) == 3
    warnings = [r for r in caplog.records if r.name == "hydrappo" and r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "2 of 3 prompts" in warnings[0].getMessage() and "to 3 tokens" in warnings[0].getMessage()

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hydrappo"):
        tokenize_prompts(texts, tokenizer, max_prompt_length=6)
    assert not caplog.records


def test_prompt_that_tokenizes_to_nothing_is_an_error():
    with pytest.raises(DataError, match=r"prompt 1 \(' '\) tokenizes to no tokens"):
        tokenize_prompts(["w1", " "], tiny_tokenizer(), max_prompt_length=8)


TEMPLATE = (
    "{{ bos_token }} {% for m in messages %}{% if m['role'] == 'system' %}w90 {% else %}w91 {% endif %}"
    "{{ m['content'] }} {% endfor %}{% if add_generation_prompt %}w89{% endif %}"
)


def bos_adding_tokenizer():
    """The tiny tokenizer, adding BOS by default as Llama-style tokenizers do."""
    tokenizer = tiny_tokenizer()
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", tokenizer.bos_token_id)]
    )
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def test_chat_template_without_double_special_tokens():
    tokenizer = bos_adding_tokenizer()
    ids = tokenizer.convert_tokens_to_ids
    assert tokenize_prompts(["w5 w6"], tokenizer, 16).input_ids == [ids(["<bos>", "w5", "w6"])]

    prompts = tokenize_prompts(["w5 w6"], tokenizer, 16, apply_chat_template=True, system_prompt="w7")
    assert prompts.texts == ["w5 w6"]
    assert prompts.formatted == ["<bos> w90 w7 w91 w5 w6 w89"]
    assert prompts.input_ids == [ids(["<bos>", "w90", "w7", "w91", "w5", "w6", "w89"])]

    no_system = tokenize_prompts(["w5"], tokenizer, 16, apply_chat_template=True)
    assert no_system.input_ids == [ids(["<bos>", "w91", "w5", "w89"])]


def test_format_prompt():
    tokenizer = tiny_tokenizer()
    assert format_prompt("w1 w2", tokenizer, apply_chat_template=False, system_prompt="ignored") == "w1 w2"
    with pytest.raises(DataError, match="no chat template"):
        format_prompt("w1", tokenizer, apply_chat_template=True, system_prompt=None)


def test_left_pad_with_pad_equal_to_eos():
    eos = tiny_tokenizer().eos_token_id
    # EOS inside real tokens must stay unmasked even though it equals the pad id.
    input_ids, attention_mask = left_pad([[5, eos], [eos, 7, 8, 9], [eos]], pad_token_id=eos)
    assert input_ids.dtype == attention_mask.dtype == torch.long
    assert input_ids.tolist() == [[eos, eos, 5, eos], [eos, 7, 8, 9], [eos, eos, eos, eos]]
    assert attention_mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 1], [0, 0, 0, 1]]


def drain(sampler, sizes):
    return [sampler.next_batch(n) for n in sizes]


def test_sampler_epochs_are_permutations_and_cross_seamlessly():
    sampler = PromptSampler(5, seed=3)
    first, second = sampler.next_batch(7), sampler.next_batch(3)
    epoch0, epoch1 = first[:5], first[5:] + second
    assert sorted(epoch0) == sorted(epoch1) == list(range(5))
    assert sampler.state_dict() == {"epoch": 1, "position": 5, "seed": 3}
    # Many epochs in one batch, each a permutation; they are not all the same order.
    many = PromptSampler(5, seed=3).next_batch(50)
    epochs = [many[i : i + 5] for i in range(0, 50, 5)]
    assert epochs[:2] == [epoch0, epoch1]
    assert all(sorted(e) == list(range(5)) for e in epochs)
    assert len({tuple(e) for e in epochs}) > 1


def test_sampler_is_deterministic_per_seed():
    sizes = [4, 9, 1, 12]
    assert drain(PromptSampler(10, seed=0), sizes) == drain(PromptSampler(10, seed=0), sizes)
    assert drain(PromptSampler(10, seed=0), sizes) != drain(PromptSampler(10, seed=1), sizes)


def test_sampler_resume_equals_uninterrupted_run():
    sizes = [4, 4, 4, 4, 4, 4, 4]
    uninterrupted = drain(PromptSampler(11, seed=7), sizes)

    first = PromptSampler(11, seed=7)
    before = drain(first, sizes[:3])  # 12 indices: into the second epoch
    state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint stores it
    resumed = PromptSampler(11, seed=999)  # the checkpoint's seed wins
    resumed.load_state_dict(state)
    assert before + drain(resumed, sizes[3:]) == uninterrupted

    with pytest.raises(DataError, match="prompt data changed"):
        PromptSampler(3, seed=7).load_state_dict({"epoch": 0, "position": 8, "seed": 7})


def test_a_dataset_saved_with_save_to_disk_and_its_splits(tmp_path):
    from datasets import DatasetDict

    single = tmp_path / "single"
    Dataset.from_dict({"prompt": ["w1", "w2"]}).save_to_disk(str(single))
    assert load_prompt_texts(str(single)) == ["w1", "w2"]
    both = tmp_path / "both"
    DatasetDict(
        {"train": Dataset.from_dict({"prompt": ["w1"]}), "test": Dataset.from_dict({"prompt": ["w9"]})}
    ).save_to_disk(str(both))
    assert load_prompt_texts(str(both), split="test") == ["w9"]
    with pytest.raises(DataError, match="has no split 'validation'; splits: train, test"):
        load_prompt_texts(str(both), split="validation")


def test_a_folder_laid_out_as_on_the_hub_with_splits_and_subsets(tmp_path):
    hub = tmp_path / "hub"
    (hub / "data").mkdir(parents=True)
    write_prompts(hub / "data" / "train-00000-of-00001.jsonl", "jsonl", ["w1", "w2"])
    write_prompts(hub / "data" / "test-00000-of-00001.jsonl", "jsonl", ["w7"])
    assert load_prompt_texts(str(hub)) == ["w1", "w2"]
    # A plain folder would read every file; the Hub layout reads the split asked for.
    assert load_prompt_texts(str(hub), split="test") == ["w7"]

    configs = tmp_path / "configs"
    (configs / "easy").mkdir(parents=True)
    (configs / "hard").mkdir()
    write_prompts(configs / "easy" / "train.jsonl", "jsonl", ["w3"])
    write_prompts(configs / "hard" / "train.jsonl", "jsonl", ["w4", "w5"])
    (configs / "README.md").write_text(
        "---\nconfigs:\n- config_name: easy\n  data_files:\n  - split: train\n    path: easy/train.jsonl\n"
        "- config_name: hard\n  data_files:\n  - split: train\n    path: hard/train.jsonl\n---\n# prompts\n"
    )
    assert load_prompt_texts(str(configs), subset="hard") == ["w4", "w5"]
    assert load_prompt_texts(str(configs), subset="easy") == ["w3"]


def test_pairs_and_sft_rows_come_through_the_same_reader(tmp_path):
    from hydrappo.config import PreferenceDataArgs, SFTDataArgs
    from hydrappo.data import load_sft_rows
    from hydrappo.preferences import load_preference_pairs

    tokenizer = tiny_tokenizer()
    saved = tmp_path / "pairs"
    Dataset.from_dict({"prompt": ["w1", "w2"], "chosen": ["w3", "w4"], "rejected": ["w5", "w6"]}).save_to_disk(
        str(saved)
    )
    pairs = load_preference_pairs(str(saved), tokenizer, PreferenceDataArgs(append_eos=False))
    ids = tokenizer.convert_tokens_to_ids
    assert pairs.prompts == ["w1", "w2"] and pairs.chosen_ids == [ids(["w3"]), ids(["w4"])]

    hub = tmp_path / "sft"
    (hub / "data").mkdir(parents=True)
    write_jsonl(hub / "data" / "train-00000-of-00001.jsonl", [{"prompt": "w1", "response": "w2"}])
    write_jsonl(hub / "data" / "validation-00000-of-00001.jsonl", [{"prompt": "w8", "response": "w9"}])
    prompts, _, responses = load_sft_rows(str(hub), tokenizer, SFTDataArgs(split="validation", append_eos=False))
    assert prompts == ["w8"] and responses == [ids(["w9"])]
