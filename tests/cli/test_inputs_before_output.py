"""Bad data and reward functions are refused before the output folder is claimed: every training
command (train, reward, sft) and the trainers built in Python read and check their tables and
reward functions first (train/inputs.py), so an earlier run in the output folder stays exactly as
it was, even with --overwrite_output_dir (no lock file, nothing moved aside), and no model loads."""

import json
from pathlib import Path

import pytest
import yaml

from hydrappo.cli import main
from hydrappo.data import DataError
from hydrappo.rewards import RewardError
from hydrappo.storage.rundir import LOCK_NAME

from runs import TINY

MODEL = {"name_or_path": str(TINY / "model"), "random_init": True, "num_layers_unfrozen": 2}


def rows(path: Path, *records: dict) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def earlier_run(folder: Path) -> dict:
    """An earlier run's files in `folder`; returns {relative path: bytes} to compare with later."""
    (folder / "checkpoint-1").mkdir(parents=True)
    (folder / "checkpoint-1" / "model.safetensors").write_bytes(b"weights")
    (folder / "metrics.jsonl").write_text('{"step": 1}\n')
    return snapshot(folder)


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def stage_config(tmp_path: Path, name: str, data: dict) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"model": MODEL, "data": data, "train": {"progress_bar": False}}))
    return path


def cases(tmp_path: Path) -> dict:
    """{case: (argv after the command's output options, the message's text)} of each bad input."""
    collision = rows(tmp_path / "collision.jsonl", {"prompt": "n1 n2", "completions": "x"})
    (tmp_path / "fns.py").write_text("def neither(sample, prompt, output):\n    return [0.0] * len(sample)\n")
    no_prompt = rows(tmp_path / "no_prompt.jsonl", {"question": "n1 n2", "answer": "x"})
    pairs = rows(tmp_path / "pairs.jsonl", *({"prompt": f"n{i}", "chosen": "g1", "rejected": "n2"} for i in range(4)))
    no_chosen = rows(tmp_path / "no_chosen.jsonl", {"prompt": "n1", "better": "g1", "rejected": "n2"})
    sft = rows(tmp_path / "sft.jsonl", *({"prompt": f"n{i}", "response": "g1"} for i in range(4)))
    no_response = rows(tmp_path / "no_response.jsonl", {"prompt": "n1", "answer": "g1"})
    config = str(TINY / "config.yaml")
    return {
        "column named like an argument": (
            ["train", config, "--prompts", str(collision)],
            f"data.prompts={collision}: column 'completions' has the name of an argument reward functions receive "
            f"(samples, prompts, outputs, completions, completion_ids), so it cannot be passed to "
            f"'{TINY / 'reward.py'}:reward_fn'; rename the column.",
        ),
        "signature of neither convention": (
            ["train", config, "--reward_fn", f"{tmp_path / 'fns.py'}:neither"],
            f"reward.reward_fn='{tmp_path / 'fns.py'}:neither' has the parameters (sample, prompt, output), which fit "
            "neither reward function convention",
        ),
        "eval file without the prompt column": (
            ["train", config, "--eval_prompts", str(no_prompt)],
            f"data.eval_prompts={no_prompt} has no column 'prompt'; columns present: question, answer. Set "
            "data.prompt_column to the column that holds it, or rename that column.",
        ),
        "pairs without the chosen column": (
            ["reward", str(stage_config(tmp_path, "reward", {"train_file": str(no_chosen)}))],
            f"data.train_file={no_chosen} has no column 'chosen'; columns present: prompt, better, rejected. Set "
            "data.chosen_column to the column that holds it, or rename that column.",
        ),
        "stats file without the prompt column": (
            ["reward", str(stage_config(tmp_path, "stats", {"train_file": str(pairs), "stats_file": str(no_prompt)}))],
            f"data.stats_file={no_prompt} has no column 'prompt'; columns present: question, answer. Set "
            "data.prompt_column to the column that holds it",
        ),
        "sft eval file without the response column": (
            ["sft", str(stage_config(tmp_path, "sft", {"train_file": str(sft), "eval_file": str(no_response)}))],
            f"data.eval_file={no_response} has no column 'response'; columns present: prompt, answer. Set "
            "data.response_column to the column that holds it, or rename that column.",
        ),
    }


@pytest.fixture
def no_model(monkeypatch):
    import hydrappo.train.harness as harness

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(harness, "build_hydra", refuse)


@pytest.mark.parametrize(
    "case",
    [
        "column named like an argument",
        "signature of neither convention",
        "eval file without the prompt column",
        "pairs without the chosen column",
        "stats file without the prompt column",
        "sft eval file without the response column",
    ],
)
def test_bad_input_leaves_an_earlier_run_untouched_even_with_overwrite(tmp_path, capsys, no_model, case):
    argv, message = cases(tmp_path)[case]
    out = tmp_path / "out"
    before = earlier_run(out)
    assert main([*argv, "--output_dir", str(out), "--overwrite_output_dir"]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert "Traceback" not in err and "((" not in err
    assert "Generating train split" not in err  # no datasets progress bar before the error
    assert snapshot(out) == before and not (out / LOCK_NAME).exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("out")] == ["out"]  # nothing moved aside


def test_the_python_api_refuses_the_same_inputs_when_the_trainer_is_built(tmp_path, no_model):
    from hydrappo import PPOTrainer, RewardTrainer, SFTTrainer

    out = tmp_path / "out"
    before = earlier_run(out)
    train = {"output_dir": str(out), "overwrite_output_dir": True}
    with pytest.raises(
        RewardError, match=r"data\.prompts \(the list given in Python\): column 'completions' has the name"
    ):
        PPOTrainer(
            model=str(TINY / "model"),
            reward_funcs=lambda completions, **kw: [0.0] * len(completions),
            train_dataset=[{"prompt": "n1", "completions": "x"}],
            args={"train": train},
        )
    with pytest.raises(DataError, match="data.chosen_column to the column that holds it"):
        RewardTrainer(
            model=str(TINY / "model"),
            train_dataset=[{"prompt": "n1", "good": "g1", "rejected": "n2"}],
            args={"train": train},
        )
    with pytest.raises(DataError, match="data.response_column to the column that holds it"):
        SFTTrainer(model=str(TINY / "model"), train_dataset=[{"prompt": "n1", "answer": "g1"}], args={"train": train})
    assert snapshot(out) == before and not (out / LOCK_NAME).exists()
