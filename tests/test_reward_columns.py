"""Dataset columns reach reward functions (trlX's and TRL's signatures, chosen by the first
parameter), several weighted reward sources and their per-source logs, and the errors of both
before any model loads; one process and two."""

import json
import textwrap
from pathlib import Path

import pytest
import torch

from hydrappo.cli import main
from hydrappo.config import RewardArgs
from hydrappo.rewards import FunctionReward, RewardError, RewardFunctionError, build_reward_source

from processes import check_ok, launch
from runs import ROOT, TINY

TRL = ROOT / "tests" / "fixtures" / "trl_style_rewards.py"
PROMPTS = [json.loads(line)["prompt"] for line in (TINY / "prompts.jsonl").read_text().splitlines()]

# trlX's signature with two columns: checks that every row's columns are its prompt's, records
# the rows it saw (one line per call and process) and scores by length.
CHECKER = """
import json, os

PROMPTS = {prompts!r}


def aligned(samples, prompts, outputs, answer, row, **kwargs):
    assert len(answer) == len(row) == len(prompts) == len(outputs)
    for p, a, r, s, o in zip(prompts, answer, row, samples, outputs):
        assert p == PROMPTS[r], (p, r)
        assert a == p.split()[-1], (a, p)
        assert s == p + o
    with open({log!r}, "a") as f:
        f.write(json.dumps({{"rank": os.environ.get("RANK", "0"), "rows": list(row)}}) + "\\n")
    return [float(len(o)) for o in outputs]
"""


def write_inputs(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(prompts.jsonl with `answer` and `row` columns, checker.py, its log)."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": p, "answer": p.split()[-1], "row": i}) + "\n" for i, p in enumerate(PROMPTS))
    )
    log = tmp_path / "calls.jsonl"
    checker = tmp_path / "checker.py"
    checker.write_text(CHECKER.format(prompts=PROMPTS, log=str(log)))
    return prompts, checker, log


def specs(checker: Path) -> str:
    return f"{TRL}:accuracy_reward,{TRL}:format_reward,{checker}:aligned"


RUN = [
    "--total_steps",
    "2",
    "--save_every",
    "0",
    "--batch_size",
    "8",
    "--mini_batch_size",
    "4",
    "--samples_per_prompt",
    "2",
    "--no_progress_bar",
    "--reward_weights",
    "2.0",
    "1.0",
    "0.25",
]


def check_run(out: Path, log: Path, processes: int) -> None:
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(calls) == 2 * processes and {c["rank"] for c in calls} == {str(r) for r in range(processes)}
    for call in calls:
        rows = call["rows"]
        assert len(rows) == 8 // processes
        assert all(rows[i] == rows[i + 1] for i in range(0, len(rows), 2))  # G = 2 samples of one prompt, together
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2
    for line in lines:
        parts = {name: line[f"env/reward/{name}"] for name in ("accuracy_reward", "format_reward", "aligned")}
        assert parts["aligned"] > 0  # response lengths: the function ran on every row
        # The logged reward is the weighted sum of the logged per-source means (means are linear).
        expected = 2.0 * parts["accuracy_reward"] + 1.0 * parts["format_reward"] + 0.25 * parts["aligned"]
        assert line["env/reward_mean"] == pytest.approx(expected, rel=1e-6)


@pytest.mark.slow
def test_columns_reach_both_signatures_weighted_and_logged(tmp_path):
    prompts, checker, log = write_inputs(tmp_path)
    out = tmp_path / "out"
    assert (
        main(
            [
                "train",
                str(TINY / "config.yaml"),
                "--output_dir",
                str(out),
                "--prompts",
                str(prompts),
                "--reward_fn",
                specs(checker),
                *RUN,
            ]
        )
        == 0
    )
    check_run(out, log, 1)


@pytest.mark.slow
def test_columns_under_two_processes_each_scoring_its_own_rows(tmp_path):
    prompts, checker, log = write_inputs(tmp_path)
    out = tmp_path / "out"
    check_ok(
        launch(
            [
                "-m",
                "hydrappo",
                "train",
                str(TINY / "config.yaml"),
                "--output_dir",
                str(out),
                "--prompts",
                str(prompts),
                "--reward_fn",
                specs(checker),
                *RUN,
            ],
            timeout=180,
        )
    )
    check_run(out, log, 2)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fns.py"
    path.write_text(textwrap.dedent(text))
    return path


def test_the_first_parameter_decides_the_convention(tmp_path):
    path = write(
        tmp_path,
        """
        def trl(prompts, completions, completion_ids, answer, **kwargs):
            assert "samples" not in kwargs and "outputs" not in kwargs
            return [float(a == c) + len(i) for c, a, i in zip(completions, answer, completion_ids)]

        def trl_no_kwargs(completions, answer):  # takes only the column it names
            return [float(a == c) for c, a in zip(completions, answer)]

        def trlx(samples, prompts, outputs):  # an old function: columns it cannot take are not passed
            return [float(len(s)) for s in samples]
    """,
    )
    columns = {"answer": ["x", "y"], "other": [1, 2]}
    inputs = dict(columns=columns, completion_ids=[[1, 2], [3]])
    trl = FunctionReward(f"{path}:trl", columns=list(columns))
    assert trl.convention == "TRL" and trl(["px", "py"], ["p", "p"], ["x", "z"], **inputs).tolist() == [3.0, 1.0]
    assert FunctionReward(f"{path}:trl_no_kwargs").convention == "TRL"
    assert FunctionReward(f"{path}:trl_no_kwargs")(["px", "pz"], ["p", "p"], ["x", "z"], **inputs).tolist() == [
        1.0,
        0.0,
    ]
    trlx = FunctionReward(f"{path}:trlx", columns=list(columns))
    assert trlx.convention == "trlX" and trlx(["ab", "c"], ["a", "c"], ["b", ""], **inputs).tolist() == [2.0, 1.0]


def test_the_trl_fixture_unchanged(tmp_path):
    source = build_reward_source(
        RewardArgs(reward_fn=f"{TRL}:accuracy_reward,{TRL}:format_reward", reward_weights=[1.0, 0.5]),
        columns=["answer"],
    )
    outputs = ["<think>hm</think> 42", "41", "<think>x</think>"]
    scored = source([f"q{o}" for o in outputs], ["q"] * 3, outputs, columns={"answer": ["42", "42", 7]})
    assert scored.total.tolist() == [1.5, 0.0, 0.5]
    assert {name: s.tolist() for name, s in scored.parts.items()} == {
        "accuracy_reward": [1.0, 0.0, 0.0],
        "format_reward": [1.0, 0.0, 1.0],
    }


@pytest.mark.parametrize(
    "text, columns, message",
    [
        ("def f(sample, prompts, outputs): return [0.0]", [], "fit neither reward function convention"),
        ("def f(*args, **kwargs): return [0.0]", [], "fit neither reward function convention"),
        (
            "def f(samples, prompts, outputs, **kw): return [0.0]",
            ["outputs"],
            "column 'outputs' has the name of an argument reward functions receive",
        ),
        (
            "def f(prompts, completions, answer, **kw): return [0.0]",
            ["solution"],
            "needs argument 'answer', which is neither one of the TRL convention's (prompts, completions, completion_ids, trainer_state, "
            "log_metric, log_extra) "
            "nor a column of data.prompts (columns: solution)",
        ),
    ],
)
def test_bad_signatures_and_columns(tmp_path, text, columns, message):
    path = write(tmp_path, text)
    with pytest.raises(RewardError, match=message.replace("(", r"\(").replace(")", r"\)")):
        FunctionReward(f"{path}:f", columns=columns)


def test_a_failing_function_among_several_is_named(tmp_path):
    path = write(
        tmp_path,
        """
        def good(completions, **kw):
            return [1.0] * len(completions)

        def bad(completions, **kw):
            raise KeyError("label")
    """,
    )
    source = build_reward_source(RewardArgs(reward_fn=[f"{path}:good", f"{path}:bad"]))
    with pytest.raises(RewardFunctionError, match=rf"reward function '{path}:bad' at step 3 raised KeyError"):
        source(["pa"], ["p"], ["a"], step=3)


def test_branch_and_function_combine(tmp_path):
    path = write(tmp_path, "def one(completions, **kw):\n    return [1.0] * len(completions)\n")
    source = build_reward_source(RewardArgs(reward_fn=f"{path}:one", use_reward_branch=True, reward_weights=[0.5, 2.0]))
    assert source.names == ["one", "reward_branch"]
    scored = source(["a", "b"], ["a", "b"], ["", ""], branch_scores=torch.tensor([1.0, -1.0]))
    assert scored.total.tolist() == [2.5, -1.5]


def tiny_classifier(folder: Path) -> Path:
    """A one-label sequence-classification model built from the tiny example's config (random
    weights, seed 0), saved with its tokenizer: a reward model as reward.reward_model names one."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(
        AutoConfig.from_pretrained(TINY / "model", num_labels=1)
    ).save_pretrained(folder)
    AutoTokenizer.from_pretrained(TINY / "model").save_pretrained(folder)
    return folder


def test_a_classifier_and_a_function_combine(tmp_path):
    path = write(tmp_path, "def length(completions, **kw):\n    return [float(len(c)) for c in completions]\n")
    source = build_reward_source(
        RewardArgs(
            reward_fn=f"{path}:length", reward_model=str(tiny_classifier(tmp_path / "rm")), reward_weights=[1.0, 0.5]
        )
    )
    assert source.names == ["length", "reward_model"]
    outputs = [" g1 g2", " n3", ""]
    scored = source([f"n1{o}" for o in outputs], ["n1"] * 3, outputs)
    total, parts = scored.total, scored.parts
    assert parts["length"].tolist() == [6.0, 3.0, 0.0] and parts["reward_model"].abs().sum() > 0
    assert torch.equal(total, parts["length"] + 0.5 * parts["reward_model"])  # the same float32 operations, in order


def test_a_classifier_and_a_function_in_training_log_each_part(tmp_path):
    """The per-source means reach metrics.jsonl and TensorBoard's scalars, and the logged reward is
    their weighted sum."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from hydrappo.train.ppo import PPOTrainer

    def length(completions, **kwargs):
        return [float(len(c.split())) for c in completions]

    trainer = PPOTrainer(
        model=str(TINY / "model"),
        reward_funcs=length,
        reward_weights=[1.0, 0.5],
        train_dataset=TINY / "prompts.jsonl",
        args={
            "model": {"random_init": True, "num_layers_unfrozen": 2},
            "reward": {"reward_model": str(tiny_classifier(tmp_path / "rm"))},
            "generation": {"max_new_tokens": 4},
            "ppo": {"batch_size": 8, "mini_batch_size": 4, "ppo_epochs": 1},
            "train": {"output_dir": str(tmp_path / "run"), "total_steps": 2, "save_every": 0, "progress_bar": False},
        },
    )
    rewards, scored = trainer.ppo_step.rewards, []
    trainer.ppo_step.rewards = lambda *args, **kwargs: scored.append(rewards(*args, **kwargs)) or scored[-1]
    history = trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2] and history == rows
    last = scored[-1].parts  # step 2's unweighted scores, per source
    # Each total is fl(f + fl(0.5 c)) in float32 (2 roundings of at most 2**-24 relative), and torch's float32
    # means of 8 values add at most 8 more; so the logged mean and the weighted sum of the logged means agree
    # within (2 + 2 * 8) * 2**-24 * (max |f| + 0.5 max |c|).
    bound = 18 * 2**-24 * (last["length"].abs().max().item() + 0.5 * last["reward_model"].abs().max().item())
    parts = rows[-1]["env/reward/length"], rows[-1]["env/reward/reward_model"]
    assert rows[-1]["env/reward_mean"] == pytest.approx(parts[0] + 0.5 * parts[1], rel=0, abs=bound)
    assert parts[0] == last["length"].mean().item() and parts[1] == last["reward_model"].mean().item()
    scalars = EventAccumulator(str(tmp_path / "run" / "tensorboard")).Reload()
    for tag in ("env/reward/length", "env/reward/reward_model", "env/reward_mean"):
        logged = [(event.step, event.value) for event in scalars.Scalars(tag)]
        assert logged == [(row["step"], pytest.approx(row[tag], rel=2**-23)) for row in rows], tag  # stored as float32


def test_errors_come_before_any_model_loads(tmp_path, monkeypatch, capsys):
    import hydrappo.train.harness as harness

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(harness, "build_hydra", no_model)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "n1 n2", "outputs": "x"}) + "\n")
    path = write(tmp_path, "def f(samples, prompts, outputs, **kw):\n    return [0.0] * len(samples)\n")
    base = ["train", str(TINY / "config.yaml"), "--output_dir", str(tmp_path / "out"), "--prompts", str(prompts)]
    assert main([*base, "--reward_fn", f"{path}:f"]) == 2
    assert "column 'outputs' has the name of an argument reward functions receive" in capsys.readouterr().err
    prompts.write_text(json.dumps({"prompt": "n1 n2", "solution": "x"}) + "\n")
    assert main([*base, "--reward_fn", f"{TRL}:accuracy_reward"]) == 2
    assert "needs argument 'answer'" in capsys.readouterr().err
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


def test_held_out_evaluation_scores_with_the_held_out_columns_and_logs_each_reward(tmp_path):
    prompts, _, _ = write_inputs(tmp_path)
    # The held-out file's answer is "" (in every completion: accuracy 1); training's are the prompts' last words.
    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text(
        "".join(json.dumps({"prompt": p, "answer": "", "row": i}) + "\n" for i, p in enumerate(PROMPTS[:6]))
    )
    out = tmp_path / "out"
    assert (
        main(
            [
                "train",
                str(TINY / "config.yaml"),
                "--output_dir",
                str(out),
                "--prompts",
                str(prompts),
                "--eval_prompts",
                str(held_out),
                "--reward_fn",
                f"{TRL}:accuracy_reward,{TRL}:format_reward",
                *RUN[:-4],
                "--reward_weights",
                "2.0",
                "1.0",
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evaluated = [row for row in rows if "eval/reward_mean" in row]
    assert [row["step"] for row in evaluated] == [0, 2]
    for row in evaluated:
        assert row["eval/reward/accuracy_reward"] == 1.0 and row["eval/prompts"] == 6
        assert row["eval/reward_mean"] == pytest.approx(2.0 + row["eval/reward/format_reward"], rel=1e-6)
