"""examples/preference/levers.py at the tiny trunk's size: variants that change which layers the
reward branch copies get their own model and cache, and every variant scores the other-style pairs."""

import json
import sys

import pytest
import torch
from runs import ROOT, reward_config, write_pairs

sys.path.insert(0, str(ROOT / "examples" / "preference"))

import levers  # noqa: E402


def with_gold_scores(path):
    """levers.py reads make_pairs.py's gold columns; the synthetic chosen response scores higher."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({**row, "gold_chosen": 1.0, "gold_rejected": 0.0}) + "\n" for row in rows))


@pytest.mark.slow
def test_layer_variants_get_their_own_split_and_score_the_other_pairs(tmp_path, monkeypatch):
    reward_config(tmp_path)  # reward.yaml (the top 2 of the tiny trunk's 4 layers) and pairs.jsonl
    with_gold_scores(tmp_path / "pairs.jsonl")
    write_pairs(tmp_path / "other.jsonl", pairs_per_prompt=1, seed=1)
    with_gold_scores(tmp_path / "other.jsonl")
    monkeypatch.setitem(levers.VARIANTS, "top1", ["--num_layers_unfrozen", "1"])
    monkeypatch.setitem(levers.VARIANTS, "from1", ["--trainable_layers", "1:3"])
    monkeypatch.chdir(tmp_path)
    argv = ["--config", "reward.yaml", "--pairs", "pairs.jsonl", "--other_pairs", "other.jsonl"]
    assert (
        levers.main([*argv, "--variants", "mean_margin", "top2", "mean", "top1", "from1", "--output_dir", "levers"])
        == 0
    )

    rows = [json.loads(line) for line in (tmp_path / "levers" / "levers.jsonl").read_text().splitlines()]
    assert [row["variant"] for row in rows] == ["mean_margin", "top2", "mean", "top1", "from1"]
    # mean_margin, top2 and mean share the config's split; top1 copies one layer, from a model of its
    # own, and a band from layer 1 copies every layer from there up (3). The margin variant scores the
    # other pairs too, though they have no margin column.
    assert [row["branch_layers"] for row in rows] == [2, 2, 2, 1, 3]
    for row in rows:
        assert 0.0 <= row["other_acc"] <= 1.0 and 0.0 <= row["held_out_acc"] <= 1.0
    # The synthetic preference (more "good" words) is learnable: the branch ranks pairs it never saw.
    assert rows[1]["other_acc"] > 0.6


def test_a_branch_of_several_heads_ranks_a_pair_by_the_heads_mean_score():
    # Pair 0: head 0 ranks it right (1 > 0), head 1 wrong (-3 < 0), and their mean wrong (-1 < 0);
    # pair 1: both heads right. By the mean: 1 of 2; a mean of the heads' accuracies would give 0.75.
    chosen = torch.tensor([[1.0, -3.0], [2.0, 2.0]])
    rejected = torch.zeros(2, 2)
    assert levers.accuracy(chosen, rejected) == 0.5
    assert levers.accuracy(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])) == 0.5
