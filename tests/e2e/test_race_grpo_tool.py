"""tools/race_grpo.py without TRL installed: its option checks, the settings both sides share, the table
it prints, a side's result kept for the next invocation, and TRL's saved policy loaded for the held-out
measurement."""

import copy
import json
import sys
from pathlib import Path

import pytest
import torch
from runs import ROOT
from tiny import tiny_model, tiny_tokenizer

sys.path.insert(0, str(ROOT / "tools"))

import race_grpo  # noqa: E402


def without_trl(monkeypatch):
    monkeypatch.setattr(race_grpo, "has_trl", lambda python: False)


def test_a_bad_option_is_named_with_its_fix(capsys, monkeypatch):
    without_trl(monkeypatch)
    for argv, message in (
        (["--sides", "hydrappo", "trl"], "--sides=hydrappo trl names trl, which is no side"),
        (["--sides", "hydrappo", "--steps", "0"], "--steps=0 must be at least 1"),
        (["--sides", "hydrappo", "--seeds", "1", "1"], "--seeds=1 1 names a seed twice"),
        ([], "--sides includes trl-full trl-lora, but TRL is not installed"),
    ):
        with pytest.raises(SystemExit) as stopped:
            race_grpo.parse_args(argv)
        error = capsys.readouterr().err
        assert stopped.value.code == 2 and message in error and "Traceback" not in error
    assert "--sides hydrappo hydrappo-top4" in error  # the way on without TRL
    args = race_grpo.parse_args(["--sides", "hydrappo", "hydrappo-top4"])
    assert args.sides == ["hydrappo", "hydrappo-top4"] and args.seeds == [0]


def test_both_sides_get_the_example_s_group_batch_tokens_temperature_rewards_steps_and_seed(monkeypatch):
    without_trl(monkeypatch)
    args = race_grpo.parse_args(["--sides", "hydrappo", "--steps", "7", "--seeds", "3"])
    matched = race_grpo.matched_settings(args, seed=3)
    assert [name for name, _, _ in matched] == [
        "answers per question (G)",
        "answers per step",
        "new tokens at most",
        "temperature",
        "reward weights",
        "steps",
        "seed",
    ]
    assert all(theirs == ours for _, theirs, ours in matched), matched
    values = {name: ours for name, _, ours in matched}
    assert values["answers per question (G)"] == 4 and values["answers per step"] == 32
    assert values["new tokens at most"] == 32 and values["steps"] == 7 and values["seed"] == 3
    full = race_grpo.trl_config_kwargs("trl-full", args, 3, Path("out"))
    lora = race_grpo.trl_config_kwargs("trl-lora", args, 3, Path("out"))
    assert (full["learning_rate"], lora["learning_rate"]) == (1e-5, 1e-4)
    # TRL's own defaults stay: nothing sets beta, the loss, reward scaling, iterations or checkpointing
    for name in ("beta", "loss_type", "scale_rewards", "num_iterations", "gradient_checkpointing"):
        assert name not in full
    assert full["bf16"] is False and full["use_cpu"] is True
    top4 = race_grpo.example_config(race_grpo.hydrappo_options("hydrappo-top4", 0))
    band = race_grpo.example_config(race_grpo.hydrappo_options("hydrappo", 0))
    assert (top4.model.num_layers_unfrozen, top4.model.trainable_layers, top4.ppo.learning_rate) == (4, None, 1e-4)
    assert (band.model.trainable_layers, band.ppo.learning_rate) == ("13:17", 3e-5)


def result(side, seed, seconds, tokens, peak, accuracy, kl):
    return {
        "side": side,
        "seed": seed,
        "steps": len(seconds),
        "peak_rss_mib": peak,
        "step_seconds": seconds,
        "sampled_tokens": tokens,
        "heldout": {"reward": accuracy, "kl": kl, "eos_frac": 1.0},
    }


def test_the_table_leaves_out_each_run_s_first_step_and_gives_trl_s_multiples():
    results = {
        "trl-lora": [result("trl-lora", 0, [99.0, 20.0, 30.0], [800, 400, 600], 4000.0, 0.5, 3.0)],
        "hydrappo": [
            result("hydrappo", 0, [50.0, 5.0, 5.0], [800, 500, 500], 1000.0, 0.7, 6.0),
            result("hydrappo", 1, [50.0, 6.0, 6.0], [800, 600, 600], 1200.0, 0.8, 7.0),
        ],
    }
    text = race_grpo.table(results)
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in text.splitlines() if "|" in line]
    rows = {row[0]: row[1:] for row in cells}
    assert rows["s/step (median)"] == ["25.00", "5.50"]  # (20, 30) and (5, 5, 6, 6): warm-up steps out
    assert rows["ms per sampled token (median)"] == ["50.0", "10.0"]  # 20/400, 30/600; 5/500 ... 6/600
    assert rows["peak RSS of the child, MiB"] == ["4000", "1200"]
    assert rows["held-out accuracy (sampled)"] == ["0.50", "0.75 (0.70, 0.80)"]
    assert rows["held-out KL to the base, nats/answer"] == ["3.00", "6.50 (6.00, 7.00)"]
    assert "trl-lora / hydrappo: 4.55x s/step, 3.33x peak RSS" in text


def test_a_side_s_result_is_kept_and_a_result_of_other_steps_is_refused(tmp_path, monkeypatch):
    without_trl(monkeypatch)
    args = race_grpo.parse_args(["--sides", "hydrappo", "--steps", "3", "--output-dir", str(tmp_path)])
    folder = tmp_path / "hydrappo" / "seed-0"
    folder.mkdir(parents=True)
    kept = result("hydrappo", 0, [1.0, 2.0, 3.0], [10, 10, 10], 100.0, 0.5, 1.0)
    (folder / "result.json").write_text(json.dumps(kept))
    monkeypatch.setattr(race_grpo, "run_variant", lambda *unused: pytest.fail("a kept side was trained again"))
    assert race_grpo.run_side(args, "hydrappo", 0) == kept
    args.steps = 5
    with pytest.raises(RuntimeError, match="holds 3 steps measured on --eval-limit None held-out questions, not 5"):
        race_grpo.run_side(args, "hydrappo", 0)
    args.steps, args.eval_limit = 3, 8  # measured on all the held-out questions, not on 8
    with pytest.raises(RuntimeError, match="not 3 steps on 8; delete"):
        race_grpo.run_side(args, "hydrappo", 0)


def test_trl_s_saved_policy_becomes_the_hydra_s_policy_and_the_untrained_model_its_reference(tmp_path):
    base = tiny_model("llama", tie_word_embeddings=True)  # tied, as SmolLM2's
    base.save_pretrained(tmp_path / "base")
    tiny_tokenizer().save_pretrained(tmp_path / "base")
    trained = copy.deepcopy(base)
    with torch.no_grad():  # what training did to every weight, the tied embeddings among them
        for parameter in trained.parameters():
            parameter.add_(torch.randn_like(parameter))
    trained.save_pretrained(tmp_path / "model")
    hydra, _, _ = race_grpo.trl_policy_hydra(tmp_path / "model", ["--name_or_path", str(tmp_path / "base")])
    policy = dict(hydra.model.named_parameters())
    reference = dict(hydra.reference_model.named_parameters())
    for name, parameter in trained.named_parameters():
        assert torch.equal(policy[name], parameter), name  # copies: exact
        assert torch.equal(reference[name], dict(base.named_parameters())[name]), name
    embeddings = trained.get_input_embeddings().weight
    assert torch.equal(hydra.model.get_output_embeddings().weight, embeddings)  # the head TRL trained, tied


def test_a_run_cut_off_while_measured_keeps_its_peak_memory_when_measured_again(tmp_path, monkeypatch):
    without_trl(monkeypatch)
    args = race_grpo.parse_args(["--sides", "hydrappo", "--steps", "1", "--output-dir", str(tmp_path)])
    # the first invocation trains; the second finds the run trained (run_variant then knows no memory)
    runs = iter(
        [
            {"command": "train", "seconds": 9.0, "peak_rss_mib": 1234.0},
            {"command": "train", "seconds": None, "peak_rss_mib": None},
        ]
    )
    monkeypatch.setattr(race_grpo, "run_variant", lambda *unused: next(runs))
    row = {"step": 1, "time/rollout": 1.0, "time/update": 2.0, "tokens/responses_len_mean": 10.0}
    monkeypatch.setattr(race_grpo, "read_metrics", lambda folder: [row])

    def cut_off(*unused):
        raise RuntimeError("stopped while measuring")

    monkeypatch.setattr(race_grpo, "evaluate", cut_off)
    with pytest.raises(RuntimeError):
        race_grpo.run_side(args, "hydrappo", 0)
    monkeypatch.setattr(race_grpo, "evaluate", lambda *unused: {"reward": 0.5, "kl": 1.0, "eos_frac": 1.0})
    measured = race_grpo.run_side(args, "hydrappo", 0)
    assert (measured["peak_rss_mib"], measured["run_seconds"]) == (1234.0, 9.0)
    assert measured["step_seconds"] == [3.0] and measured["sampled_tokens"] == [320.0]  # 10 tokens x 32 answers
