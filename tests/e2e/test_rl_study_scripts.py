"""The study scripts' shared module (tools/rl_study.py) at the tiny example's size: a frontier of
one KL coefficient and a one-row top-N study run, measure and plot; the arithmetic format term."""

import json
import sys

import pytest

from runs import ROOT, TINY

sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "examples" / "arithmetic"))

pytest.importorskip("matplotlib")

import rl_study  # noqa: E402
from reward import accuracy, format_ok, format_reward  # noqa: E402


DEFAULTS = {
    "config": TINY / "config.yaml",
    "eval_prompts": TINY / "prompts.jsonl",
    "reward_fn": f"{TINY / 'reward.py'}:reward_fn",
    "knob": "init_kl_coef",
    "values": [0.3],
    "output_dir": "unused",
}


@pytest.mark.slow
def test_frontier_and_study_run_measure_and_plot(tmp_path):
    args = ["--steps", "2", "--limit", "8", "--output_dir", str(tmp_path / "frontier")]
    assert rl_study.frontier_main(DEFAULTS, "frontier", args) == 0
    written = json.loads((tmp_path / "frontier" / "frontier.json").read_text())
    assert written["base"]["kl"] == 0.0  # the untrained policy is the reference
    assert [p["value"] for p in written["points"]] == [0.3]
    for point in written["points"]:
        assert point["steps"] == 2 and point["kl"] > 0 and 0 <= point["eos_frac"] <= 1 and point["peak_rss_mib"] > 0
    assert (tmp_path / "frontier" / "frontier.png").stat().st_size > 1000

    args = ["--steps", "1", "--limit", "4", "--variants", "N=1", "--output_dir", str(tmp_path / "study")]
    assert rl_study.study_main(DEFAULTS, "study", args) == 0
    rows = json.loads((tmp_path / "study" / "study.json").read_text())
    assert [r["name"] for r in rows] == ["N=1"] and rows[0]["steps"] == 1
    assert (tmp_path / "study" / "study.md").read_text().count("\n") == 3


def test_planner_column_follows_the_setting():
    one, full, lora = (
        rl_study.planner_figure(rl_study.STUDY_VARIANTS[name])
        for name in ("N=1", "full (N=-1)", "LoRA r=16, all layers")
    )
    assert one["planner_peak_gib"] < lora["planner_peak_gib"] < full["planner_peak_gib"]
    assert one["planner_fits"] and not full["planner_fits"]  # an 8B model on a 24 GB GPU


def test_distinct_n_by_hand():
    assert rl_study.distinct_n([[1, 2, 1, 2], [3]]) == 2 / 3  # bigrams (1,2) (2,1) (1,2): 2 distinct of 3
    assert rl_study.distinct_n([[5]]) == 0.0


def test_arithmetic_rewards():
    assert format_ok("3 + 4 = 7") and format_ok("11 + 6 equals 17.")
    assert not format_ok("3 + 4 = 7\n\n👉👉👉") and not format_ok("7. This is the sum.")
    completions = ["3 + 4 = 7", "3 + 4 = 7\n👉", "3 + 4 = 8", "The sum is 7 (3 + 4)."]
    assert accuracy(completions, answer=["7"] * 4) == [1.0, 1.0, 0.0, 0.0]  # the LAST integer counts
    assert format_reward(completions) == [1.0, 0.0, 1.0, 0.0]


def test_frontier_measures_the_base_with_the_runs_extra_options(tmp_path, monkeypatch):
    # --extra options (e.g. --reward_branch_path, when the config's own path is not there) go to the
    # base model's config too: parsing the config alone would refuse the missing path.
    seen = {}

    class Stop(Exception):
        pass

    def fake_heldout(run_dir, prompts, reward_fn, **kwargs):
        seen.update(run_dir=run_dir, **kwargs)
        raise Stop

    monkeypatch.setattr(rl_study, "heldout", fake_heldout)
    args = ["--output_dir", str(tmp_path), "--extra", "--max_new_tokens", "3"]
    with pytest.raises(Stop):
        rl_study.frontier_main(DEFAULTS, "frontier", args)
    assert seen["run_dir"] is None and seen["base_options"] == ["--max_new_tokens", "3"]


def test_heldout_base_model_takes_options():
    base = rl_study.heldout(
        None,
        TINY / "prompts.jsonl",
        f"{TINY / 'reward.py'}:reward_fn",
        base_config=TINY / "config.yaml",
        limit=4,
        base_options=["--max_new_tokens", "3"],
    )
    assert base["kl"] == 0.0 and 0 < base["response_tokens_mean"] <= 3  # the option reached the generation
