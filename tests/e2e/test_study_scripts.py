"""The study scripts' shared modules (hydrappo/study/) at the tiny example's size: a frontier of
one KL coefficient and a one-row top-N study run, measure and plot; the arithmetic format term."""

import json
import sys
from types import SimpleNamespace

import pytest

from hydrappo.config import parse_config
from runs import ROOT, TINY

sys.path.insert(0, str(ROOT / "examples" / "arithmetic"))

pytest.importorskip("matplotlib")

from hydrappo.study import sweeps  # noqa: E402
from hydrappo.study.measure import distinct_n, heldout, measure_main, same_opening_share  # noqa: E402
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
    assert sweeps.frontier_main(DEFAULTS, "frontier", args) == 0
    written = json.loads((tmp_path / "frontier" / "frontier.json").read_text())
    assert written["base"]["kl"] == 0.0  # the untrained policy is the reference
    assert [p["value"] for p in written["points"]] == [0.3]
    for point in written["points"]:
        assert point["steps"] == 2 and point["kl"] > 0 and 0 <= point["eos_frac"] <= 1 and point["peak_rss_mib"] > 0
    assert (tmp_path / "frontier" / "frontier.png").stat().st_size > 1000

    args = ["--steps", "1", "--limit", "4", "--variants", "N=1", "--output_dir", str(tmp_path / "study")]
    args += ["--extra", "--eval_prompts", str(TINY / "prompts.jsonl")]  # a held-out curve for the report
    assert sweeps.study_main(DEFAULTS, "study", args) == 0
    rows = json.loads((tmp_path / "study" / "study.json").read_text())
    assert [r["name"] for r in rows] == ["N=1"] and rows[0]["steps"] == 1
    assert (tmp_path / "study" / "study.md").read_text().count("\n") == 3
    trained = rows[0]["peak_rss_mib"]

    # Run again on the finished folder: only measured, and what its training recorded is kept.
    assert sweeps.study_main(DEFAULTS, "study", args) == 0
    again = json.loads((tmp_path / "study" / "study.json").read_text())
    assert len(again) == 1 and again[0]["peak_rss_mib"] == trained > 0

    # The report reads the learning rate (not on this command line) and how the curve was answered
    # from the run's own checkpoint: the tiny config's.
    table = tmp_path / "report.md"
    report = [str(table), str(tmp_path / "report.png"), str(tmp_path / "study"), "--curve", "eval/reward_mean"]
    assert sweeps.report_main(report) == 0
    tiny = parse_config(TINY / "config.yaml", [])
    decoding = "greedy" if tiny.train.eval_greedy else "sampled"
    rate = sweeps.learning_rate_text(tiny.ppo.learning_rate, tiny.ppo.lr_scheduler)
    assert f"| N=1 | {rate} | {decoding} |" in table.read_text()
    written = table.read_text()
    with pytest.raises(SystemExit, match="no run in .* logged eval/missing"):
        sweeps.report_main([str(table), str(tmp_path / "r.png"), str(tmp_path / "study"), "--curve", "eval/missing"])
    assert table.read_text() == written  # the refused report left the earlier table as it was

    # The run's checkpoint measured at two sampling seeds: two draws, resumed from the file.
    measured = tmp_path / "measured.jsonl"
    measure = [str(tmp_path / "study" / "N1"), "--prompts", str(TINY / "prompts.jsonl"), "--limit", "4"]
    measure += ["--reward_fn", DEFAULTS["reward_fn"], "--seeds", "1", "2", "--output", str(measured)]
    assert measure_main(measure) == 0
    lines = measured.read_text().splitlines()
    draws = [json.loads(line) for line in lines]
    assert [d["seed"] for d in draws] == [1, 2] and all(d["prompts"] == 4 and d["kl"] > 0 for d in draws)
    assert measure_main(measure) == 0
    assert measured.read_text().splitlines() == lines  # nothing measured twice
    one_seed = heldout(tmp_path / "study" / "N1", TINY / "prompts.jsonl", DEFAULTS["reward_fn"], limit=4, seed=2)
    assert one_seed["reward"] == draws[1]["reward"] and one_seed["kl"] == draws[1]["kl"]  # what the study measures


def test_planner_column_follows_the_setting():
    one, full, lora = (
        sweeps.planner_figure(sweeps.STUDY_VARIANTS[name]) for name in ("N=1", "full (N=-1)", "LoRA r=16, all layers")
    )
    assert one["planner_peak_gib"] < lora["planner_peak_gib"] < full["planner_peak_gib"]
    assert one["planner_fits"] and not full["planner_fits"]  # an 8B model on a 24 GB GPU


@pytest.mark.parametrize("example", ["arithmetic", "sentiment"])
def test_every_study_setting_is_a_valid_config_of_the_examples(example):
    """Each setting's options on top of the example's config pass the config checks (a band in the
    config and LoRA in every layer, say, would be refused at the start of its run)."""
    for name, options in sweeps.STUDY_VARIANTS.items():
        config = parse_config(ROOT / "examples" / example / "config.yaml", options)
        assert config.model.trainable_layers is None or "--trainable_layers" in options, name


def test_distinct_n_by_hand():
    assert distinct_n([[1, 2, 1, 2], [3]]) == 2 / 3  # bigrams (1,2) (2,1) (1,2): 2 distinct of 3
    assert distinct_n([[5]]) == 0.0


def test_same_opening_share_by_hand():
    texts = ["I'm thrilled to see it.", "i'm THRILLED to   see more", "The film is long.", "I'm thrilled to help"]
    # The first four words, lower-cased and re-spaced: "i'm thrilled to see" twice, then two others.
    assert same_opening_share(texts) == (0.5, "i'm thrilled to see")
    assert same_opening_share(texts, words=3) == (0.75, "i'm thrilled to")
    assert same_opening_share([]) == (0.0, "")


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

    monkeypatch.setattr(sweeps, "heldout", fake_heldout)
    args = ["--output_dir", str(tmp_path), "--extra", "--max_new_tokens", "3"]
    with pytest.raises(Stop):
        sweeps.frontier_main(DEFAULTS, "frontier", args)
    assert seen["run_dir"] is None and seen["base_options"] == ["--max_new_tokens", "3"]


def test_heldout_base_model_takes_options():
    base = heldout(
        None,
        TINY / "prompts.jsonl",
        f"{TINY / 'reward.py'}:reward_fn",
        base_config=TINY / "config.yaml",
        limit=4,
        base_options=["--max_new_tokens", "3"],
    )
    assert base["kl"] == 0.0 and 0 < base["response_tokens_mean"] <= 3  # the option reached the generation


def test_learning_rate_grid_by_kind_of_setting():
    assert sweeps.learning_rate_grid(["--num_layers_unfrozen", "4"]) == sweeps.LEARNING_RATE_GRIDS["layers"]
    assert sweeps.learning_rate_grid(["--trainable_layers", "13:17"]) == sweeps.LEARNING_RATE_GRIDS["layers"]
    assert sweeps.learning_rate_grid(["--lora_r", "16"]) == sweeps.LEARNING_RATE_GRIDS["lora"]
    assert sweeps.learning_rate_grid(["--num_layers_unfrozen", "-1"]) == sweeps.LEARNING_RATE_GRIDS["full"]


def test_report_joins_studies_run_in_parts_and_plots_each_setting_at_its_best_rate(tmp_path, monkeypatch):
    """Two study folders written by hand (a sweep of one setting split over two folders, and another
    setting): one table row per run with its held-out curve, one point per setting in the PNG."""
    rates = {"a1": (1e-4, "constant"), "a2": (3e-5, "cosine"), "b": (3e-4, "constant")}

    def kept(run_dir):  # these runs kept no checkpoint: the settings their checkpoints would give
        rate, schedule = rates[run_dir.name]
        return SimpleNamespace(
            ppo=SimpleNamespace(learning_rate=rate, lr_scheduler=schedule), train=SimpleNamespace(eval_greedy=False)
        )

    monkeypatch.setattr(sweeps, "checkpoint_config", kept)
    measured = {"reward": 0.5, "kl": 3.0, "eos_frac": 1.0, "degenerate_frac": 0.0, "peak_rss_mib": 100.0}
    curves = {"a1": [0.3, 0.5, 0.4], "a2": [0.3, 0.6, 0.7], "b": [0.3, 0.2, 0.1]}
    for folder, runs in {
        "one": [("a1", "N=4", "1e-4"), ("b", "band=13:17", "3e-4")],
        "two": [("a2", "N=4", "3e-5")],
    }.items():
        rows = []
        for run, setting, rate in runs:
            run_dir = tmp_path / run
            run_dir.mkdir()
            lines = [{"step": 10 * i, "eval/reward/accuracy": value} for i, value in enumerate(curves[run])]
            (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
            flag = "--trainable_layers 13:17" if setting.startswith("band") else "--num_layers_unfrozen 4"
            command = f"python -m hydrappo train c.yaml {flag} --learning_rate {rate} --output_dir {run_dir}"
            rows.append({"name": f"{setting} lr={rate}", "command": command, **measured})
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "study.json").write_text(json.dumps(rows))
    table, png = tmp_path / "t.md", tmp_path / "t.png"
    assert sweeps.report_main([str(table), str(png), str(tmp_path / "one"), str(tmp_path / "two")]) == 0
    lines = table.read_text().splitlines()
    assert len(lines) == 2 + 3 and "step 20" in lines[0]
    n4 = [line for line in lines if line.startswith("| N=4 |")]
    assert [line.split(" | ")[1:3] for line in n4] == [["3e-05 cosine", "sampled"], ["1e-04", "sampled"]]  # by rate
    assert "0.70 (20)" in n4[0] and "0.50 (10)" in n4[1]  # the best point of each curve, and its step
    assert png.stat().st_size > 1000

    # Continued later with only the second folder at hand: the first table's rows are read back
    # (--earlier), and the folder's run replaces the earlier row of its setting and rate.
    again = tmp_path / "again.md"
    continued = [str(again), str(tmp_path / "again.png"), str(tmp_path / "two"), "--earlier", str(table)]
    assert sweeps.report_main(continued) == 0
    assert again.read_text() == table.read_text()
    rerun = [{"step": 10 * i, "eval/reward/accuracy": value} for i, value in enumerate([0.3, 0.9])]
    (tmp_path / "a2" / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in rerun))
    assert sweeps.report_main(continued) == 0
    n4 = [line for line in again.read_text().splitlines() if line.startswith("| N=4 | 3e-05")]
    assert len(n4) == 1 and "0.90 (10)" in n4[0]
    with pytest.raises(SystemExit, match="--earlier .*study.json: not a table written by"):
        sweeps.report_main([str(again), str(png), "--earlier", str(tmp_path / "two" / "study.json")])


def test_the_committed_study_tables_read_back_as_written():
    """read_report_table() inverts report_table() on the examples' own tables."""
    for example in ("arithmetic", "sentiment"):
        written = (ROOT / "examples" / example / "layers_study.md").read_text()
        rows = sweeps.read_report_table(written)
        assert len(rows) >= 5 and all(r["curve"] and r["planner_peak_gib"] > 0 for r in rows)
        assert sweeps.report_table(rows) == written


def test_a_tie_on_the_curve_goes_to_the_rate_with_the_better_sampled_score():
    rows = [
        {"setting": "band=14:16", "lr": 3e-5, "best": 0.80, "reward": 0.71},
        {"setting": "band=14:16", "lr": 1e-4, "best": 0.80, "reward": 0.79},
        {"setting": "band=14:16", "lr": 1e-5, "best": 0.64, "reward": 0.90},  # a lower curve loses whatever it samples
        {"setting": "N=4", "lr": 1e-4, "best": None, "reward": 0.5},  # no held-out curve: no point
    ]
    best = sweeps.best_run_per_setting(rows)
    assert list(best) == ["band=14:16"] and best["band=14:16"]["lr"] == 1e-4


def test_report_says_which_run_left_no_checkpoint(tmp_path):
    (tmp_path / "study").mkdir()
    command = f"python -m hydrappo train c.yaml --output_dir {tmp_path / 'cut'}"
    (tmp_path / "study" / "study.json").write_text(json.dumps([{"name": "N=4", "command": command}]))
    (tmp_path / "cut").mkdir()
    with pytest.raises(SystemExit, match="settings from its checkpoint.*cut"):
        sweeps.report_main([str(tmp_path / "t.md"), str(tmp_path / "t.png"), str(tmp_path / "study")])


def test_report_refuses_a_file_or_a_folder_without_a_study_in_one_line(tmp_path):
    table, png = tmp_path / "t.md", tmp_path / "t.png"
    table.write_text("| setting | lr | curve |\n")
    (tmp_path / "empty").mkdir()
    for folder, words in (
        (table, r"t\.md is a file, not a study folder; .* goes after --earlier"),
        (tmp_path / "empty", r"empty holds no study\.json"),
        (tmp_path / "missing", r"missing does not exist"),
    ):
        with pytest.raises(SystemExit, match=words) as refused:
            sweeps.report_main([str(tmp_path / "new.md"), str(png), str(folder)])
        assert "\n" not in str(refused.value.code)
    assert not (tmp_path / "new.md").exists() and not png.exists()


def test_measure_refuses_one_seed_and_a_folder_without_a_checkpoint(tmp_path):
    common = ["--prompts", str(TINY / "prompts.jsonl"), "--reward_fn", DEFAULTS["reward_fn"]]
    with pytest.raises(SystemExit, match="at least two different seeds"):
        measure_main([str(tmp_path), *common, "--seeds", "3", "3"])
    with pytest.raises(SystemExit, match="measure: .*not a hydrappo checkpoint"):
        measure_main([str(tmp_path), *common])
    with pytest.raises(SystemExit, match="--prompts .*missing.jsonl: no such file"):
        measure_main([str(tmp_path), "--prompts", str(tmp_path / "missing.jsonl"), *common[2:]])


def test_learning_rate_text_names_a_schedule_that_is_not_constant():
    assert sweeps.learning_rate_text(3e-5, "constant") == "3e-05"
    assert sweeps.learning_rate_text(1e-4, "cosine") == "1e-04 cosine"


def test_option_value_reads_the_last_occurrence():
    command = "train c.yaml --learning_rate 1e-4 --output_dir d --learning_rate 3e-5"
    assert sweeps.option_value(command, "--learning_rate") == "3e-5"
    assert sweeps.option_value(command, "--missing", "x") == "x"
