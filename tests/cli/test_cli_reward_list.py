"""generate and compare score as the run did: the weighted reward list (`--reward_fn a.py:x,a.py:y`
or repeated, with `--reward_weights`), and compare takes a run folder as generate and export do."""

import json
import textwrap

import pytest

from hydrappo.cli import main
from hydrappo.config import parse_config
from hydrappo.train.ppo import PPOTrainer

from runs import TINY

REWARDS = textwrap.dedent(
    """
    def goods(completions, **kwargs):  # small whole numbers: a weighted sum is exact
        return [float(sum(w.startswith("g") for w in c.split())) for c in completions]

    def words(completions, **kwargs):
        return [float(len(c.split())) for c in completions]
    """
)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("reward_list")
    (root / "a.py").write_text(REWARDS)
    config = parse_config(
        TINY / "config.yaml",
        [
            "--output_dir",
            str(root / "run"),
            "--total_steps",
            "1",
            "--batch_size",
            "8",
            "--mini_batch_size",
            "8",
            "--ppo_epochs",
            "1",
            "--no_progress_bar",
        ],
    )
    PPOTrainer(config, config_dir=TINY).train()
    return root


def rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["commas", "repeated"])
def test_generate_and_compare_score_with_the_weighted_list(run, how, capsys, monkeypatch):
    monkeypatch.chdir(run)  # a.py relative to the working directory, as a user types it
    rewards = (
        ["--reward_fn", "a.py:goods,a.py:words"]
        if how == "commas"
        else ["--reward_fn", "a.py:goods", "--reward_fn", "a.py:words"]
    )
    common = ["--prompts", str(TINY / "prompts.jsonl"), "--limit", "4", *rewards, "--reward_weights", "1", "0.5"]
    assert main(["generate", "run", "--no_base", "--output", f"gen-{how}.jsonl", *common]) == 0
    assert main(["compare", "run", "--output", f"cmp-{how}.jsonl", *common]) == 0  # a run folder: its newest checkpoint
    generated, compared = rows(run / f"gen-{how}.jsonl"), rows(run / f"cmp-{how}.jsonl")
    for row in generated:
        words = row["response"].split()
        assert row["score"] == sum(w.startswith("g") for w in words) + 0.5 * len(words)
    assert [r["score"] for r in compared] == [r["score"] for r in generated]
    assert [r["response"] for r in compared] == [r["response"] for r in generated]


def test_weights_that_do_not_fit_the_list_are_refused_before_a_model_loads(tmp_path, capsys):
    (tmp_path / "a.py").write_text(REWARDS)
    code = main(
        [
            "compare",
            str(TINY / "model"),
            "--prompts",
            str(TINY / "prompts.jsonl"),
            "--reward_fn",
            f"{tmp_path / 'a.py'}:goods,{tmp_path / 'a.py'}:words",
            "--reward_weights",
            "1",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "--reward_weights=[1.0] has 1 weight(s) for 2 --reward_fn function(s)" in err, err
