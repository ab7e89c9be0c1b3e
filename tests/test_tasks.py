"""A reasoning-gym task as a run's prompts and reward (tasks/reasoning_gym.py, tasks/base.py,
config/task.py): the prompts, the verifier on hand-made completions, held-out items that are never
training questions, the refusals before any model loads, and short runs on the tiny model from a
config section and from Python (with an extra reward function, GRPO, held-out evaluation, resume)."""

import json
import sys
from collections import Counter

import pytest
import reasoning_gym
import yaml

from hydrappo import PPOTrainer
from hydrappo.config import ConfigError, parse_config
from hydrappo.tasks import TaskReward
from hydrappo.tasks import ReasoningGymTask

from runs import TINY

# chain_sum with 2 or 3 one-digit terms has few distinct questions: held-out items must skip repeats.
SMALL = {"min_terms": 2, "max_terms": 3, "max_digits": 1}


def test_prompts_are_the_questions_with_the_answer_instruction():
    task = ReasoningGymTask("chain_sum", size=6, seed=3, eval_size=2, **SMALL)
    expected = reasoning_gym.create_dataset("chain_sum", seed=3, size=6, **SMALL)
    rows = task.train_dataset
    assert [row["prompt"].split("\n\n")[0] for row in rows] == [expected[i]["question"] for i in range(6)]
    assert all("<answer>" in row["prompt"] and "</answer>" in row["prompt"] for row in rows)
    assert [row["answer"] for row in rows] == [expected[i]["answer"] for i in range(6)]
    assert [row["item"] for row in rows + task.eval_dataset] == list(range(8))
    assert {row["task"] for row in rows} == {"chain_sum"}


def test_the_verifier_scores_the_answer_between_tags_with_the_tasks_own_scorer():
    task = ReasoningGymTask("chain_sum", size=4, seed=0, **SMALL)
    rows, (verify,) = task.train_dataset, task.reward_funcs
    answer = rows[0]["answer"]
    completions = [
        f"Let me add. <answer>{answer}</answer>",  # right
        f"<answer>{int(answer) + 1}</answer>",  # wrong
        f"The answer is {answer}.",  # no tags: nothing to score, whatever the reply holds
        f"<answer>0</answer> no, <answer>{answer}</answer>",  # the last pair counts
        f"<answer>x = {answer}</answer>",  # reasoning-gym's partial credit: len(answer) / len(reply)
        [{"role": "assistant", "content": f"<answer>{answer}</answer>"}],  # TRL's conversational form
    ]
    scores = verify(completions, task=["chain_sum"] * 6, item=[0] * 6)
    assert scores[:4] == [1.0, 0.0, 0.0, 1.0] and scores[5] == 1.0
    assert scores[4] == pytest.approx(len(answer) / len(f"x = {answer}"))
    assert verify([f"<answer>{answer}</answer>"], task=["basic_arithmetic"], item=[0]) == [None]  # not its row


def test_an_answer_start_is_the_assistant_turn_the_model_continues_and_the_verifier_reads():
    task = ReasoningGymTask("chain_sum", size=2, answer_start="<answer>", **SMALL)
    row = task.train_dataset[0]
    assert row["prompt"][-1] == {"role": "assistant", "content": "<answer>"} and row["prompt"][0]["role"] == "user"
    (verify,) = task.reward_funcs
    reward = TaskReward(verify, columns=["task", "answer", "item"])
    scores = reward(
        ["", ""],
        ["", ""],
        [f"{row['answer']}</answer>", "0 </answer>"],
        columns={"task": ["chain_sum"] * 2, "item": [0, 0], "answer": [row["answer"]] * 2},
        prompt_messages=[row["prompt"]] * 2,
    )
    assert scores.tolist() == [1.0, float(row["answer"] == "0")]
    # The start opened the tag: a response that ends without closing it is the answer to its end.
    assert verify([f"<answer> {row['answer']}"], task=["chain_sum"], item=[0]) == [1.0]
    assert verify([f"{row['answer']}"], task=["chain_sum"], item=[0]) == [0.0]  # (without the start: no tags)


def test_a_seed_one_higher_is_the_same_items_shifted_so_held_out_items_come_from_their_own_seeds():
    # The pitfall: item i of seed s is item i - 1 of seed s + 1.
    a, b = (reasoning_gym.create_dataset("chain_sum", seed=s, size=10) for s in (7, 8))
    assert [a[i + 1]["question"] for i in range(9)] == [b[i]["question"] for i in range(9)]
    task = ReasoningGymTask("chain_sum", size=150, seed=7, eval_size=40, **SMALL)
    train = [row["prompt"] for row in task.train_dataset]
    held_out = [row["prompt"] for row in task.eval_dataset]
    assert len(held_out) == 40 and len(set(held_out)) == 40
    assert not set(held_out) & set(train)  # no held-out question is a training question
    assert len(set(train)) < len(train)  # (the task repeats questions: the check above is not vacuous)


def test_held_out_items_stay_the_same_when_the_training_size_changes():
    small, large = (ReasoningGymTask("chain_sum", size=n, eval_size=5) for n in (10, 200))
    assert [r["prompt"] for r in small.eval_dataset] == [r["prompt"] for r in large.eval_dataset]


def test_a_task_space_too_small_for_the_held_out_items_is_refused():
    task = ReasoningGymTask("chain_sum", size=400, eval_size=200, min_terms=2, max_terms=2, max_digits=1)
    with pytest.raises(ConfigError, match="held-out candidates ask a question that training does not"):
        task.items()


def test_a_mix_deals_items_by_weight_and_scores_each_task_with_its_own_verifier():
    task = ReasoningGymTask(
        [{"name": "chain_sum", "weight": 2, "config": SMALL}, {"name": "basic_arithmetic", "weight": 1, "config": {}}],
        size=30,
        eval_size=6,
    )
    assert Counter(row["task"] for row in task.train_dataset) == {"chain_sum": 20, "basic_arithmetic": 10}
    assert Counter(row["task"] for row in task.eval_dataset) == {"chain_sum": 4, "basic_arithmetic": 2}
    rows = task.train_dataset
    completions = [f"<answer>{row['answer']}</answer>" for row in rows]
    tasks, items = [row["task"] for row in rows], [row["item"] for row in rows]
    for verify in task.reward_funcs:
        scores = verify(completions, task=tasks, item=items)
        assert [s is not None for s in scores] == [t == verify.__name__ for t in tasks]
        assert {s for s in scores if s is not None} == {1.0}


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (
            lambda: ReasoningGymTask("chain_sums"),
            ["not a reasoning-gym task", "Did you mean chain_sum", "basic_arithmetic"],
        ),
        (lambda: ReasoningGymTask("chain_sum", max_term=3), ["no option 'max_term'", "Did you mean 'max_terms'"]),
        (lambda: ReasoningGymTask("chain_sum", min_terms=5, max_terms=2), ["max_terms must be >= min_terms"]),
        (lambda: ReasoningGymTask("chain_sum", seed=1, **{"size": 3, "eval_size": -1}), ["eval_size=-1"]),
        (lambda: ReasoningGymTask({"chain_sum": {"weight": 0}}), ["task.tasks.chain_sum.weight=0"]),
    ],
)
def test_a_bad_task_is_refused_with_what_would_work(make, words):
    with pytest.raises(ConfigError) as error:
        make()
    for word in words:
        assert word in str(error.value)


def test_a_missing_reasoning_gym_is_refused_with_the_install_note(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym.factory", None)  # import fails as if not installed
    with pytest.raises(ConfigError, match=r"hydrappo\[reasoning\].*C compiler"):
        ReasoningGymTask("chain_sum")


def task_config(tmp_path, **sections) -> dict:
    """The tiny example's options with a task section in place of its prompts and reward function."""
    config = yaml.safe_load((TINY / "config.yaml").read_text())
    config["model"]["name_or_path"] = str(TINY / "model")
    del config["reward"]["reward_fn"]
    config["data"] = {"max_prompt_length": 16}  # shorter than every task prompt
    config["generation"] = {"max_new_tokens": 4, "generation_batch_size": 8}
    config["ppo"].update(batch_size=8, mini_batch_size=8, ppo_epochs=1)
    config["train"].update(output_dir=str(tmp_path / "run"), total_steps=2, save_every=1, progress_bar=False)
    config["task"] = {"task_name": "chain_sum", "task_config": SMALL, "task_size": 16, "task_eval_size": 4}
    for section, options in sections.items():
        config.setdefault(section, {}).update(options)
    return config


def write(tmp_path, config) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_the_task_section_is_read_from_yaml_and_the_command_line(tmp_path):
    config = task_config(
        tmp_path,
        task={
            "task_name": None,
            "task_config": None,
            "tasks": {"chain_sum": 2, "leg_counting": {"config": {"max_animals": 2}}},
        },
    )
    parsed = parse_config(write(tmp_path, config), ["--task_eval_size", "3"])
    assert parsed.task.tasks == {"chain_sum": 2, "leg_counting": {"config": {"max_animals": 2}}}
    assert parsed.to_dict()["task"]["tasks"] == parsed.task.tasks  # what config.yaml records, for a resume
    parsed = parse_config(None, ["--task_name", "chain_sum", "--task_config", "{max_terms: 3}"], check=False)
    assert ReasoningGymTask.from_args(parsed.task).specs == [("chain_sum", 1.0, {"max_terms": 3})]


@pytest.mark.parametrize(
    ("section", "words"),
    [
        ({"data": {"prompts": "prompts.jsonl"}}, ["data.prompts='prompts.jsonl' and the task section both give"]),
        ({"task": {"tasks": {"chain_sum": 1}}}, ["task.tasks={'chain_sum': 1} and task.task_name both name"]),
        ({"task": {"task_config": "[1, 2]"}}, ["task.task_config='[1, 2]' must be a mapping"]),
        ({"reward": {"reward_weights": [1.0, 2.0]}}, ["2 weight(s) for 1 reward source(s)", "then the task"]),
        ({"train": {"eval_every": 1}, "task": {"task_eval_size": 0}}, ["train.eval_every=1 has nothing to evaluate"]),
    ],
)
def test_the_config_checks_refuse_a_task_section_at_odds_with_the_rest(tmp_path, section, words):
    with pytest.raises(ConfigError) as error:
        parse_config(write(tmp_path, task_config(tmp_path, **section)))
    for word in words:
        assert word in str(error.value)


def test_an_unknown_task_is_refused_before_any_model_loads(tmp_path, monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("a model was built")

    monkeypatch.setattr("hydrappo.train.harness.build_hydra", no_model)
    config = task_config(tmp_path, task={"task_name": "chain_summ"})
    with pytest.raises(ConfigError, match="Did you mean chain_sum"):
        PPOTrainer(parse_config(write(tmp_path, config)))
    assert not (tmp_path / "run").exists()


def metrics(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_grpo_run_from_the_task_section_with_an_extra_reward_logs_each_and_resumes(tmp_path):
    config = task_config(
        tmp_path,
        reward={"reward_fn": str(TINY / "reward.py") + ":reward_fn", "reward_weights": [0.5, 1.0]},
        ppo={"advantage_estimator": "grpo", "init_kl_coef": 0.0},
        generation={"samples_per_prompt": 2},
        train={"eval_every": 1},
        task={
            "task_name": None,
            "task_config": None,
            "tasks": {"chain_sum": {"weight": 1, "config": SMALL}, "basic_arithmetic": 1},
        },
    )
    path = write(tmp_path, config)
    trainer = PPOTrainer(parse_config(path))
    longest = max(len(trainer.tokenizer(row["prompt"])["input_ids"]) for row in trainer.inputs.task.train_dataset)
    assert trainer.config.data.max_prompt_length >= longest > 16  # raised to fit the task's prompts: none is cut
    trainer.train()
    records = metrics(tmp_path / "run")
    steps = [r for r in records if "env/reward_mean" in r]
    assert {"env/reward/reward_fn", "env/reward/chain_sum", "env/reward/basic_arithmetic"} <= set(steps[-1])
    evaluated = [r for r in records if "eval/reward_mean" in r]
    assert [r["step"] for r in evaluated] == [0, 1, 2]
    assert {"eval/reward/chain_sum", "eval/reward/basic_arithmetic"} <= set(evaluated[-1])
    for name in ("chain_sum", "basic_arithmetic"):  # the share of its held-out items solved outright
        assert 0.0 <= evaluated[-1][f"eval/solved/{name}"] <= evaluated[-1][f"eval/reward/{name}"] + 1e-12
    saved = yaml.safe_load((tmp_path / "run" / "checkpoint-2" / "config.yaml").read_text())
    assert saved["task"]["tasks"]["basic_arithmetic"] == 1  # the run records its task
    history = PPOTrainer(parse_config(path, ["--total_steps", "3"])).train(resume=True)
    assert history[-1]["step"] == 3


@pytest.mark.slow
def test_a_ppo_run_from_python_with_a_task_object(tmp_path):
    config = task_config(tmp_path)
    del config["task"]
    task = ReasoningGymTask("chain_sum", size=16, seed=1, eval_size=4, **SMALL)
    trainer = PPOTrainer(model=str(TINY / "model"), task=task, args=config)
    history = trainer.train()
    assert history[-1]["step"] == 2 and "env/reward/chain_sum" in history[-1]
    assert trainer.evaluate()["eval/prompts"] == 4.0
    saved = yaml.safe_load((tmp_path / "run" / "checkpoint-2" / "config.yaml").read_text())
    assert saved["task"]["task_name"] == "chain_sum" and saved["task"]["task_config"] == SMALL


@pytest.mark.slow
def test_generate_and_compare_answer_the_task_s_held_out_items_scored_by_its_verifier(tmp_path):
    from hydrappo.evaluation.compare import compare, generate

    config = task_config(tmp_path, train={"total_steps": 1})
    PPOTrainer(parse_config(write(tmp_path, config))).train()
    held_out = ReasoningGymTask("chain_sum", size=16, eval_size=4, **SMALL).eval_dataset
    (verify,) = ReasoningGymTask("chain_sum", size=16, eval_size=4, **SMALL).reward_funcs

    def scored_by_the_verifier(rows):
        assert [row["prompt"] for row in rows] == [item["prompt"] for item in held_out]  # the run's held-out items
        scores = verify([row["response"] for row in rows], task=["chain_sum"] * 4, item=[i["item"] for i in held_out])
        assert [row["score"] for row in rows] == scores  # no --reward_fn: the task's own verifier scores

    columns = generate(tmp_path / "run")  # no --prompts: the task's held-out items, not its training ones
    assert list(columns) == ["base", "trained (checkpoint-1)"]
    for rows in columns.values():
        scored_by_the_verifier(rows)
    (rows,) = generate(tmp_path / "run", limit=2, no_base=True).values()
    assert [row["prompt"] for row in rows] == [item["prompt"] for item in held_out[:2]]
    (rows,) = compare([str(tmp_path / "run")]).values()
    scored_by_the_verifier(rows)
    # --greedy: the most likely tokens, whatever the seed (sampled answers change with it).
    (greedy,) = compare([str(tmp_path / "run")], greedy=True, seed=0).values()
    (again,) = compare([str(tmp_path / "run")], greedy=True, seed=1).values()
    (sampled,) = compare([str(tmp_path / "run")], seed=1).values()
    scored_by_the_verifier(greedy)
    responses = [[row["response"] for row in column] for column in (greedy, again, sampled, rows)]
    assert responses[0] == responses[1] and responses[2] != responses[3]
    (trained,) = generate(tmp_path / "run", no_base=True, greedy=True, seed=5).values()
    assert [row["response"] for row in trained] == responses[0]
    with pytest.raises(ConfigError, match="--prompts FILE: no checkpoint among the models names a task"):
        compare([str(TINY / "model")], None)  # refused before the model loads
    # python -m hydrappo.study measure on a task run: the same held-out items, scored by the verifier, with the KL.
    from hydrappo.study.measure import measure_main

    measured = tmp_path / "measured.jsonl"
    assert measure_main([str(tmp_path / "run"), "--seeds", "1", "2", "--output", str(measured)]) == 0
    rows = [json.loads(line) for line in measured.read_text().splitlines()]
    assert [row["seed"] for row in rows] == [1, 2] and all(row["prompts"] == 4 for row in rows)
    assert all(0.0 <= row["solved"] <= row["reward"] <= 1.0 and row["kl"] == row["kl"] for row in rows)


def test_partial_credit_off_scores_only_full_marks():
    """reasoning-gym's scorers pay part of a point to an answer that contains the right one; with
    partial_credit=False (task.task_partial_credit: false) such an answer scores 0, full marks 1."""
    scores = {}
    for partial in (True, False):
        task = ReasoningGymTask("chain_sum", size=2, partial_credit=partial, **SMALL)
        (verify,) = task.reward_funcs
        (row, _) = task.train_dataset
        answers = [f"<answer>{row['answer']}</answer>", f"<answer>= {row['answer']}</answer>", "<answer>x</answer>"]
        scores[partial] = verify(answers, task=["chain_sum"] * 3, item=[row["item"]] * 3)
    assert scores[True][0] == scores[False][0] == 1.0
    assert 0.0 < scores[True][1] < 1.0 and scores[False][1] == 0.0  # "= 7" contains 7: partial credit only
    assert scores[True][2] == scores[False][2] == 0.0
    assert ReasoningGymTask.from_args(task.args).args.task_partial_credit is False  # the config section carries it


# A second task library, written as a user would: a Task subclass in a module of their own, named by
# one line of tasks/registry.py's LIBRARIES. It shows that nothing outside tasks/ assumes reasoning-gym.
TOY_LIBRARY = '''
from hydrappo.tasks import Task, Verifier


class LetterVerifier(Verifier):
    def score(self, completion, entry):
        text = completion if isinstance(completion, str) else completion[-1]["content"]
        return 1.0 if entry["letter"] in text else 0.0


class LetterTask(Task):
    """Say a given letter: item i asks for the i-th letter of the alphabet."""

    def __init__(self, args):
        self.args, self.size, self.eval_size = args, args.task_size, args.task_eval_size
        self.entries = {i: {"letter": "abcdefghijklmnopqrstuvwxyz"[i % 26]} for i in range(self.size + self.eval_size)}

    @classmethod
    def from_args(cls, args):
        return cls(args)

    @property
    def names(self):
        return ["letters"]

    def rows(self, split="train"):
        items = range(self.size) if split == "train" else range(self.size, self.size + self.eval_size)
        return [{"prompt": f"Say the letter {self.entries[i]['letter']}.", "task": "letters", "item": i} for i in items]

    @property
    def reward_funcs(self):
        return [LetterVerifier("letters", self.entries)]
'''


@pytest.fixture
def toy_library(tmp_path, monkeypatch):
    from hydrappo.tasks import registry

    (tmp_path / "toy_letters.py").write_text(TOY_LIBRARY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(registry.LIBRARIES, "letters", "toy_letters:LetterTask")
    return {"task_library": "letters", "task_name": "letters", "task_config": None, "task_size": 8, "task_eval_size": 2}


def test_a_second_task_library_is_built_by_its_registry_line_and_scored_by_its_own_verifier(tmp_path, toy_library):
    from hydrappo.config.task import TaskArgs
    from hydrappo.tasks.registry import task_class, task_from_args

    task = task_from_args(TaskArgs(**toy_library))
    assert type(task).__name__ == "LetterTask" and task.names == ["letters"]
    assert [row["prompt"] for row in task.eval_dataset] == ["Say the letter i.", "Say the letter j."]
    assert task.held_out() == {"task": ["letters", "letters"], "item": [8, 9]}
    (source,) = task.reward_sources(["task", "item"])
    scores = source(["", ""], ["", ""], ["it is i", "no"], columns={"task": ["letters"] * 2, "item": [8, 8]})
    assert scores.tolist() == [1.0, 0.0]
    with pytest.raises(ConfigError, match="the known ones: letters, reasoning_gym"):
        task_class("letterz")


@pytest.mark.slow
def test_a_ppo_run_from_a_second_task_library_evaluates_with_its_verifier_and_records_it(tmp_path, toy_library):
    config = task_config(tmp_path, train={"eval_every": 1}, task=toy_library)
    PPOTrainer(parse_config(write(tmp_path, config))).train()
    records = metrics(tmp_path / "run")
    assert "env/reward/letters" in [r for r in records if "env/reward_mean" in r][-1]
    evaluated = [r for r in records if "eval/reward_mean" in r]
    assert [r["step"] for r in evaluated] == [0, 1, 2] and 0.0 <= evaluated[-1]["eval/solved/letters"] <= 1.0
    saved = yaml.safe_load((tmp_path / "run" / "checkpoint-2" / "config.yaml").read_text())
    assert saved["task"]["task_library"] == "letters"
