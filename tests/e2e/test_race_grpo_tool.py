"""tools/lab/race_grpo.py without TRL installed: its option checks, the settings both sides share, the table
it prints, a side's result kept for the next invocation, and TRL's saved policy loaded for the held-out
measurement."""

import copy
import json
import sys
from pathlib import Path

import pytest
import torch

from hydrappo.study import sweeps

from runs import ROOT
from tiny import tiny_model, tiny_tokenizer

sys.path.insert(0, str(ROOT / "tools" / "lab"))

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
        "optimizer steps per step",
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
    assert values["optimizer steps per step"] == 4  # 2 epochs x 2 mini-batches of 16, on both sides
    full = race_grpo.trl_config_kwargs("trl-full", args, 3, Path("out"))
    lora = race_grpo.trl_config_kwargs("trl-lora", args, 3, Path("out"))
    assert (full["learning_rate"], lora["learning_rate"]) == (1e-5, 1e-4)
    # TRL's own defaults stay: nothing sets beta, the loss, reward scaling or checkpointing
    for name in ("beta", "loss_type", "scale_rewards", "gradient_checkpointing"):
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
        "curve_every": 10,
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
    assert rows["held-out accuracy (sampled) after the compared steps"] == ["0.50", "0.75 (0.70, 0.80)"]
    assert rows["held-out KL to the base, nats/answer"] == ["3.00", "6.50 (6.00, 7.00)"]
    assert "trl-lora / hydrappo: 4.55x s/step, 3.33x peak RSS" in text


def test_a_side_s_result_is_kept_and_a_result_of_other_steps_is_refused(tmp_path, monkeypatch):
    without_trl(monkeypatch)
    args = race_grpo.parse_args(["--sides", "hydrappo", "--steps", "3", "--output-dir", str(tmp_path)])
    folder = tmp_path / "hydrappo-lr3e-05" / "seed-0"  # the config's rate names the run
    assert race_grpo.run_folder(args, "hydrappo", 0) == folder
    folder.mkdir(parents=True)
    kept = result("hydrappo", 0, [1.0, 2.0, 3.0], [10, 10, 10], 100.0, 0.5, 1.0)
    (folder / "result.json").write_text(json.dumps(kept))
    monkeypatch.setattr(sweeps, "run_variant", lambda *unused: pytest.fail("a kept side was trained again"))
    assert race_grpo.run_side(args, "hydrappo", 0) == kept
    args.steps = 5
    with pytest.raises(RuntimeError, match="holds 3 steps measured on --eval-limit None held-out questions every"):
        race_grpo.run_side(args, "hydrappo", 0)
    args.steps, args.eval_limit = 3, 8  # measured on all the held-out questions, not on 8
    with pytest.raises(RuntimeError, match="not 3 steps on 8 every 10; delete"):
        race_grpo.run_side(args, "hydrappo", 0)
    args.eval_limit, args.curve_every = None, 1  # measured every 10 steps, not every step
    with pytest.raises(RuntimeError, match="not 3 steps on None every 1; delete"):
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
    monkeypatch.setattr(sweeps, "run_variant", lambda *unused: next(runs))
    row = {"step": 1, "time/rollout": 1.0, "time/update": 2.0, "tokens/responses_len_mean": 10.0}
    monkeypatch.setattr(sweeps, "read_metrics", lambda folder: [row])

    def cut_off(*unused):
        raise RuntimeError("stopped while measuring")

    monkeypatch.setattr(race_grpo, "evaluate", cut_off)
    monkeypatch.setattr(race_grpo, "base_point", lambda args: {"step": 0, "seconds": 0.0, "reward": 0.1})
    with pytest.raises(RuntimeError):
        race_grpo.run_side(args, "hydrappo", 0)
    monkeypatch.setattr(race_grpo, "evaluate", lambda *unused: {"reward": 0.5, "kl": 1.0, "eos_frac": 1.0})
    measured = race_grpo.run_side(args, "hydrappo", 0)
    assert (measured["peak_rss_mib"], measured["run_seconds"]) == (1234.0, 9.0)
    assert measured["step_seconds"] == [3.0] and measured["sampled_tokens"] == [320.0]  # 10 tokens x 32 answers


def test_the_curve_is_measured_at_every_nth_step_and_the_last_with_checkpoints_kept_for_each(monkeypatch):
    without_trl(monkeypatch)
    for argv, steps in (
        (["--steps", "20"], [10, 20]),
        (["--steps", "25", "--curve-every", "10"], [10, 20, 25]),
        (["--steps", "7", "--curve-every", "0"], [7]),
        (["--steps", "3", "--curve-every", "1"], [1, 2, 3]),
    ):
        assert race_grpo.curve_steps(race_grpo.parse_args(["--sides", "hydrappo", *argv])) == steps, argv
    args = race_grpo.parse_args(["--sides", "hydrappo", "--steps", "25"])
    options = race_grpo.hydrappo_options("hydrappo", 0, args)
    config = race_grpo.example_config([*options, "--total_steps", "25"])
    assert (config.train.save_every, config.train.keep_last) == (10, 3)  # checkpoints 10, 20 and the last: kept
    assert "--save_every" not in race_grpo.hydrappo_options("hydrappo", 0)  # the matched settings: unchanged


def test_a_curve_point_measured_is_kept_and_each_point_carries_the_seconds_trained_to_reach_it(tmp_path, monkeypatch):
    without_trl(monkeypatch)
    args = race_grpo.parse_args(["--sides", "hydrappo", "--steps", "3", "--curve-every", "2"])
    measured = []

    def evaluate(side, folder, limit, step):
        measured.append(step)
        if len(measured) == 2:
            raise RuntimeError("stopped while measuring the last step")
        return {"reward": 0.5, "kl": 0.25, "eos_frac": 1.0, "samples": []}

    monkeypatch.setattr(race_grpo, "evaluate", evaluate)
    with pytest.raises(RuntimeError):
        race_grpo.measure_curve(args, "hydrappo", tmp_path, [4.0, 1.0, 2.0])
    assert measured == [2, None]  # step 2's checkpoint, then the final policy (None)
    points, last = race_grpo.measure_curve(args, "hydrappo", tmp_path, [4.0, 1.0, 2.0])
    assert measured == [2, None, None]  # step 2 kept from the first call
    assert last == {"reward": 0.5, "kl": 0.25, "eos_frac": 1.0, "samples": []}  # the whole last measurement
    assert [(p["step"], p["seconds"], p["reward"], p["kl"]) for p in points] == [
        (2, 5.0, 0.5, 0.25),
        (3, 7.0, 0.5, 0.25),
    ]


def test_the_curve_table_gives_each_side_s_mean_over_seeds_with_kl_and_seconds():
    runs = {
        "trl-lora": [
            {
                "curve": [
                    {"step": 0, "seconds": 0, "reward": 0.1, "kl": 0.0},
                    {"step": 10, "seconds": 200, "reward": 0.3, "kl": 1.0},
                ]
            }
        ],
        "hydrappo": [
            {
                "curve": [
                    {"step": 0, "seconds": 0, "reward": 0.1, "kl": 0.0},
                    {"step": 10, "seconds": 60, "reward": 0.4, "kl": 2.0},
                ]
            },
            {
                "curve": [
                    {"step": 0, "seconds": 0, "reward": 0.1, "kl": 0.0},
                    {"step": 10, "seconds": 80, "reward": 0.6, "kl": 4.0},
                ]
            },
        ],
    }
    lines = race_grpo.curve_table(runs).splitlines()
    assert lines[0] == "| step | trl-lora: accuracy (KL, s) | hydrappo: accuracy (KL, s) |"
    assert lines[2:] == ["| 0 | 0.10 (0.00, 0) | 0.10 (0.00, 0) |", "| 10 | 0.30 (1.00, 200) | 0.50 (3.00, 70) |"]


def test_a_lora_adapter_saved_mid_run_is_merged_into_the_base_as_the_hydra_s_policy(tmp_path):
    from peft import LoraConfig, get_peft_model

    base = tiny_model("llama", tie_word_embeddings=True)
    base.save_pretrained(tmp_path / "base")
    tiny_tokenizer().save_pretrained(tmp_path / "base")
    lora = get_peft_model(copy.deepcopy(base), LoraConfig(r=2, target_modules="all-linear", init_lora_weights=False))
    lora.save_pretrained(tmp_path / "adapter")  # what the TRL child saves at a curve step
    merged = lora.merge_and_unload()
    hydra, _, _ = race_grpo.trl_policy_hydra(tmp_path / "adapter", ["--name_or_path", str(tmp_path / "base")])
    policy = dict(hydra.model.named_parameters())
    changed = 0
    for name, parameter in merged.named_parameters():
        assert torch.equal(policy[name], parameter), name
        changed += not torch.equal(parameter, dict(base.named_parameters())[name])
    assert changed > 0  # the adapter moved weights, and the hydra holds the moved ones


def test_sides_of_different_lengths_are_compared_after_the_steps_all_ran(monkeypatch):
    without_trl(monkeypatch)
    args = race_grpo.parse_args(["--sides", "hydrappo", "--steps", "20", "--hydrappo-steps", "50"])
    assert (race_grpo.steps_of(args), race_grpo.steps_of(args, "trl-lora"), race_grpo.steps_of(args, "hydrappo")) == (
        20,
        20,
        50,
    )
    assert race_grpo.curve_steps(args, "hydrappo") == [10, 20, 30, 40, 50]
    with pytest.raises(SystemExit):
        race_grpo.parse_args(["--sides", "hydrappo", "--steps", "20", "--hydrappo-steps", "10"])
    trl = result("trl-lora", 0, [9.0, 9.0], [100, 100], 4000.0, 0.5, 3.0)
    ours = result("hydrappo", 0, [3.0, 3.0, 1.0, 1.0], [100, 100, 50, 50], 1000.0, 0.9, 8.0)  # steps 3-4: not TRL's
    ours["curve"] = [{"step": 2, "seconds": 6.0, "reward": 0.6, "kl": 4.0, "eos_frac": 1.0}]
    text = race_grpo.table({"trl-lora": [trl], "hydrappo": [ours]})
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")[1:]]
        for line in text.splitlines()
        if "|" in line
    }
    assert rows["held-out accuracy (sampled) after the compared steps"] == ["0.50", "0.60"]  # hydrappo's step 2
    assert rows["held-out KL to the base, nats/answer"] == ["3.00", "4.00"]
    assert rows["held-out accuracy after the side's last step"] == ["0.50", "0.90"]
    assert "Held out after 2 steps" in text
    assert rows["s/step (median)"] == ["9.00", "3.00"] and rows["sampled tokens per step (mean)"] == ["100", "100"]


def write_config(folder: Path, replace: dict[str, str]) -> Path:
    """examples/arithmetic/config.yaml with `replace`'s edits, in `folder` beside copies of its files."""
    folder.mkdir(parents=True)
    example = ROOT / "examples" / "arithmetic"
    for name in ("reward.py", "train_prompts.jsonl", "eval_prompts.jsonl"):
        (folder / name).write_text((example / name).read_text())
    text = (example / "config.yaml").read_text()
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    path = folder / "config.yaml"
    path.write_text(text)
    return path


def test_a_config_that_cannot_race_is_refused_with_what_to_change(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(race_grpo, "has_trl", lambda python: True)  # the TRL sides' own checks
    (tmp_path / "broken.yaml").write_text("model: [unclosed\n")
    no_held_out = write_config(tmp_path / "a", {"  eval_prompts: ": "  # eval_prompts: ", "  eval_every: 10": ""})
    for argv, message in (
        (["--config", str(tmp_path / "missing.yaml")], "does not exist"),
        (["--config", str(tmp_path / "broken.yaml")], "broken.yaml does not parse: config file"),
        (["--config-options", "--seed 'unclosed"], '--config-options="--seed \'unclosed" is not a command line'),
        (["--config-options", "--no_such_option 3"], "does not parse"),
        (["--config", str(no_held_out)], "needs data.eval_prompts and a reward.reward_fn"),
        (["--trl-full-lr", "1e-5", "0"], "--trl-full-lr=1e-05 0.0 must be positive"),
        (["--hydrappo-lr", "1e-5", "1e-05"], "--hydrappo-lr=1e-05 1e-05 names a rate twice"),
    ):
        with pytest.raises(SystemExit) as stopped:
            race_grpo.parse_args(argv)
        error = capsys.readouterr().err
        assert stopped.value.code == 2 and message in error and "Traceback" not in error, (argv, error)


def test_a_batch_trl_cannot_split_is_refused_when_a_trl_side_races(tmp_path, monkeypatch):
    monkeypatch.setattr(race_grpo, "has_trl", lambda python: True)

    class Parsed:  # what config_problem reads of a config hydrappo itself would refuse
        def __init__(self, batch, mini, group):
            self.agent = self.task = type("Off", (), {"enabled": False, "task_eval_size": 0})()
            self.data = type("Data", (), {"prompts": "p.jsonl", "eval_prompts": "e.jsonl"})()
            self.reward = type("Reward", (), {"function_specs": ["r.py:f"], "reward_model": None})()
            self.reward.use_reward_branch = False
            self.ppo = type("PPO", (), {"batch_size": batch, "mini_batch_size": mini})()
            self.generation = type("Generation", (), {"samples_per_prompt": group})()

    args = race_grpo.parse_args(["--sides", "trl-full", "hydrappo"])
    for parsed, message in (
        (Parsed(30, 10, 4), "ppo.batch_size=30 is not a multiple of generation.samples_per_prompt=4"),
        (Parsed(32, 12, 4), "ppo.batch_size=32 is not a multiple of ppo.mini_batch_size=12"),
        (Parsed(32, 16, 1), "TRL's GRPOTrainer needs num_generations >= 2"),
    ):
        monkeypatch.setattr(race_grpo, "example_config", lambda options, config, parsed=parsed: parsed)
        assert message in race_grpo.config_problem(args)
    args.trl_optimizer_steps = "default"  # TRL's one optimizer step of the whole batch: no mini-batches
    monkeypatch.setattr(race_grpo, "example_config", lambda options, config: Parsed(32, 12, 4))
    assert race_grpo.config_problem(args) is None
    args.sides = ["hydrappo"]  # no TRL side: its batch rules do not apply
    monkeypatch.setattr(race_grpo, "example_config", lambda options, config: Parsed(30, 10, 4))
    assert race_grpo.config_problem(args) is None


def reasoning_args(tmp_path, *argv, options: str = ""):
    """The reasoning example's config, its SFT model replaced by a tiny model saved in tmp_path
    (`options`: more of its options)."""
    base = tmp_path / "base"
    if not base.exists():
        tiny_model("llama").save_pretrained(base)
        tiny_tokenizer().save_pretrained(base)
    config = ROOT / "examples" / "reasoning" / "config.yaml"
    return race_grpo.parse_args(
        ["--config", str(config), "--config-options", f"--name_or_path {base} {options}", *argv]
    )


def test_matched_optimizer_steps_give_trl_hydrappo_s_epochs_and_mini_batches_on_the_reasoning_example(
    tmp_path, monkeypatch
):
    pytest.importorskip("reasoning_gym")
    without_trl(monkeypatch)
    args = reasoning_args(tmp_path, "--sides", "hydrappo", "--steps", "5")
    matched = race_grpo.trl_config_kwargs("trl-full", args, 0, Path("out"))
    # batch_size 32 in mini-batches of 16, 2 epochs: 4 optimizer steps of 16 answers on each batch of 32
    assert (matched["per_device_train_batch_size"], matched["steps_per_generation"], matched["num_iterations"]) == (
        16,
        2,
        2,
    )
    assert matched["max_steps"] == 4 * 5 and matched["num_generations"] == 4
    assert matched["max_completion_length"] == 24 and matched["reward_weights"] == [1.0]  # the task's verifier
    rows = {name: (theirs, ours) for name, theirs, ours in race_grpo.matched_settings(args)}
    assert all(theirs == ours for theirs, ours in rows.values()), rows
    assert rows["optimizer steps per step"] == (4, 4) and rows["steps"] == (5, 5)
    assert race_grpo.race_settings(args)["name"] == "examples/reasoning (chain_sum)"
    args.trl_optimizer_steps = "default"  # TRL's own: one optimizer step of the whole batch
    default = race_grpo.trl_config_kwargs("trl-full", args, 0, Path("out"))
    assert (default["per_device_train_batch_size"], default["max_steps"]) == (32, 5)
    assert "num_iterations" not in default and "steps_per_generation" not in default
    rows = {name: (theirs, ours) for name, theirs, ours in race_grpo.matched_settings(args)}
    assert rows["optimizer steps per step"] == (1, 4) and rows["steps"] == (5, 5)


def test_trl_s_optimizer_steps_are_gathered_per_sampled_batch_and_saved_after_the_same_batches(monkeypatch):
    without_trl(monkeypatch)
    assert race_grpo.per_batch([9.0, 1.0, 1.0, 1.0, 8.0, 2.0, 2.0, 2.0], 4) == [12.0, 14.0]  # generation in the first
    assert race_grpo.per_batch([3.0, 4.0], 1) == [3.0, 4.0]
    with pytest.raises(ValueError, match="7 optimizer steps are not whole sampled batches of 4"):
        race_grpo.per_batch([1.0] * 7, 4)
    args = race_grpo.parse_args(["--sides", "hydrappo", "--steps", "3", "--curve-every", "1"])
    assert race_grpo.trl_saved_at(args, "trl-full") == {4: 1, 8: 2}  # optimizer step -> batches; 3: model/
    args.trl_optimizer_steps = "default"
    assert race_grpo.trl_saved_at(args, "trl-full") == {1: 1, 2: 2}


def test_each_side_and_rate_is_a_run_of_its_own_folder_and_column(tmp_path, monkeypatch):
    monkeypatch.setattr(race_grpo, "has_trl", lambda python: True)
    args = race_grpo.parse_args(
        ["--sides", "hydrappo", "hydrappo-top4", "--hydrappo-lr", "1e-5", "3e-5", "--output-dir", str(tmp_path)]
    )
    assert race_grpo.race_runs(args) == [
        ("hydrappo", 1e-5),
        ("hydrappo", 3e-5),
        ("hydrappo-top4", 1e-5),
        ("hydrappo-top4", 3e-5),
    ]
    assert race_grpo.run_folder(args, "hydrappo-top4", 2, 3e-5) == tmp_path / "hydrappo-top4-lr3e-05" / "seed-2"
    options = race_grpo.hydrappo_options("hydrappo-top4", 0, args, 3e-5)
    config = race_grpo.race_config(args, options)
    assert (config.model.num_layers_unfrozen, config.ppo.learning_rate) == (4, 3e-5)  # the swept rate wins
    plain = race_grpo.parse_args(["--sides", "hydrappo", "hydrappo-top4", "trl-lora", "--trl-lora-lr", "1e-4", "3e-4"])
    names = [race_grpo.run_name(side, rate) for side, rate in race_grpo.race_runs(plain)]
    assert names == ["hydrappo-lr3e-05", "hydrappo-top4-lr0.0001", "trl-lora-lr0.0001", "trl-lora-lr0.0003"]
    results = {
        "trl-lora-lr0.0001": [result("trl-lora", 0, [9.0, 8.0], [100, 100], 4000.0, 0.5, 3.0)],
        "hydrappo-lr3e-05": [result("hydrappo", 0, [3.0, 2.0], [100, 100], 1000.0, 0.6, 4.0)],
    }
    text = race_grpo.table(results)
    assert text.splitlines()[0] == "| | trl-lora-lr0.0001 | hydrappo-lr3e-05 |"
    assert "trl-lora-lr0.0001 / hydrappo-lr3e-05: 4.00x s/step, 4.00x peak RSS" in text


def test_the_trl_rows_are_hydrappo_s_task_prompts_and_the_verifier_sees_the_answer_start(tmp_path, monkeypatch):
    pytest.importorskip("reasoning_gym")
    without_trl(monkeypatch)
    args = reasoning_args(tmp_path, "--sides", "hydrappo", options="--task_answer_start <answer>")
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}w1 {{ m['content'] }} w2 {% endfor %}"
    # a word-level tokenizer reads the task's text as unknown words; what counts is that both sides agree
    config = race_grpo.race_config(args)
    rows, rewards = race_grpo.trl_inputs(config, tokenizer)
    from hydrappo.tasks import ReasoningGymTask

    task_rows = ReasoningGymTask.from_args(config.task).rows("train")
    assert len(rows) == len(task_rows) == 100
    assert [row["item"] for row in rows] == [row["item"] for row in task_rows]
    assert rows[0]["prompt_messages"] == task_rows[0]["prompt"]  # the answer start's message list
    assert rows[0]["prompt"].endswith("w2 w1 <answer>")  # the assistant's turn continued, as hydrappo formats it
    assert len(rewards) == 1 and rewards[0].__name__ == "chain_sum"
    row = rows[0]
    right, wrong = f"{row['answer']}</answer>", "99999</answer>"  # TRL's completions: after the answer start
    scores = rewards[0](
        prompts=[row["prompt"]] * 2,
        completions=[right, wrong],
        prompt_messages=[row["prompt_messages"]] * 2,
        task=[row["task"]] * 2,
        item=[row["item"]] * 2,
        trainer_state=None,
    )
    assert scores == [1.0, 0.0]
