"""A data file with a giant line (a 200 MB .json written on one line) is refused with the line, its
size and what to do, found by reading the file in blocks: datasets would parse that line whole,
in memory at several times its size, until the OS killed the process. The bound is lowered here
so that a file of a few MB stands for one of hundreds."""

from __future__ import annotations

import json

import pytest

from hydrappo import data
from hydrappo.data import DataError, read_table

MB = 1 << 20


@pytest.fixture
def two_mb_bound(monkeypatch):
    monkeypatch.setattr(data, "MAX_LINE_BYTES", 2 * MB)


def _row(text_bytes: int) -> str:
    return json.dumps({"prompt": "a" * text_bytes})


def test_a_jsonl_row_past_the_bound_is_named_with_its_line_and_size(tmp_path, two_mb_bound):
    file = tmp_path / "prompts.jsonl"
    long_row = _row(3 * MB)  # spans several of the reader's blocks
    file.write_text(f"{_row(10)}\n{long_row}\n{_row(10)}\n")
    with pytest.raises(DataError) as error:
        read_table(file, ["prompt"], setting="data.prompts")
    message = str(error.value)
    assert message.startswith(f"data.prompts: {file}: line 2 is 3.0 MB long ({len(long_row)} bytes), past the 2 MB")
    assert "split or shorten that row" in message


def test_a_json_file_on_one_line_past_the_bound_is_told_to_become_jsonl(tmp_path, two_mb_bound):
    file = tmp_path / "pairs.json"
    file.write_text(json.dumps([{"prompt": "p" * 1000, "chosen": "c", "rejected": "r"}] * 3000))  # no newline
    with pytest.raises(DataError) as error:
        read_table(file, ["prompt", "chosen", "rejected"], setting="data.train_file")
    message = str(error.value)
    assert f"line 1 is {file.stat().st_size / MB:.1f} MB long ({file.stat().st_size} bytes)" in message
    assert "jq -c '.[]' pairs.json > pairs.jsonl" in message and "point data.train_file at that file" in message


def test_lines_under_the_bound_read_as_before(tmp_path, two_mb_bound):
    file = tmp_path / "prompts.jsonl"
    file.write_text(f"{_row(MB)}\n{_row(10)}\n" * 2)
    table = read_table(file, ["prompt"], setting="data.prompts")
    assert [len(text) for text in table["prompt"]] == [MB, 10, MB, 10]


@pytest.mark.parametrize("block", [1, 3, 7, 64])
def test_line_numbers_and_sizes_hold_across_block_boundaries(tmp_path, monkeypatch, block):
    """Lines of 20 bytes (the bound) pass; the first of 21 is named, whatever the block size."""
    monkeypatch.setattr(data, "MAX_LINE_BYTES", 20)
    monkeypatch.setattr(data, "_BLOCK", block)
    file = tmp_path / "prompts.txt"
    file.write_bytes(b"x" * 5 + b"\n" + b"y" * 20 + b"\n\n" + b"z" * 20 + b"\n" + b"w" * 25 + b"\n" + b"v" * 30)
    with pytest.raises(DataError, match=r": line 5 is 0\.0 MB long \(25 bytes\), past the 0 MB"):
        read_table(file, ["prompt"], setting="data.prompts", allow_text=True)
    file.write_bytes(b"x" * 5 + b"\n" + b"y" * 20 + b"\n" + b"v" * 21)  # the last line, with no newline
    with pytest.raises(DataError, match=r": line 3 is 0\.0 MB long \(21 bytes\)"):
        read_table(file, ["prompt"], setting="data.prompts", allow_text=True)
