"""Every logged key is declared once (hydrappo/train/metric_keys.py) and docs/metrics.md is that
table: the keys the source writes (read with `ast`), the keys one tiny run of each stage writes to
metrics.jsonl, and the page, each checked against the table."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from hydrappo.train import metric_keys
from hydrappo.train.metric_keys import METRICS, STAGES, metric_of

from runs import FIXTURES, ROOT, TINY, VERIFIABLE, agent_run_options, reward_config, save_tiny_tool_tokenizer
from runs import tiny_trainer, write_dpo_config, write_sft_config

PACKAGE = ROOT / "hydrappo"
# Modules whose slash-joined strings are not metrics: the planner's validation names its
# (trunk quantization / optimizer) settings "none/adamw", "int8/adamw8bit", ... and logs nothing.
NOT_METRIC_MODULES = {"hydrappo/planner/validate.py"}
# A metric key's shape: words joined by "/" ("{}" where an f-string formats a value in).
KEY_SHAPE = re.compile(r"[\w{}]*(/[\w{}]+)+")


def key_text(node) -> list[str]:
    """The text of a str literal or an f-string ("{}" for each formatted value); both branches of
    `a if c else b`; [] for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return ["".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)]
    if isinstance(node, ast.IfExp):
        return key_text(node.body) + key_text(node.orelse)
    return []


def keys_in_source(tree: ast.AST) -> list[tuple[str, int]]:
    """(key, line) of every string used as a stats key: a dict's keys (literal or comprehension),
    a subscript (`stats["objective/kl"] = ...`, `last["env/reward_mean"]`), `d.get(key)`, the left of
    `key in record`, and a loop's `progress = {label: key}`."""
    found = []
    for node in ast.walk(tree):
        candidates = []
        if isinstance(node, ast.Dict):
            candidates = [key for key in node.keys if key is not None]
        elif isinstance(node, ast.DictComp):
            candidates = [node.key]
        elif isinstance(node, ast.Subscript):
            candidates = [node.slice]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            candidates = node.args[:1]
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            candidates = [node.left]
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "progress" for t in node.targets):
            candidates = getattr(node.value, "values", [])
        for candidate in candidates:
            found += [(text, candidate.lineno) for text in key_text(candidate) if KEY_SHAPE.fullmatch(text)]
    return found


def declared(text: str) -> bool:
    """Whether a key the source names is in the table: as it is, as a pattern's instance, or (a
    statistic a prefix is put before: algo/'s `policy/clipfrac` is logged as `ppo/policy/clipfrac`) as
    the end of a declared key. "{}" in `text` (an f-string) stands for any text."""
    if "{}" not in text and metric_of(text) is not None:
        return True
    parts = [".*" if part == "{}" else re.escape(part) for part in re.split(r"({})", text)]
    pattern = re.compile("(.*/)?" + "".join(parts))
    return any(pattern.fullmatch(metric.key) for metric in METRICS)


def test_every_key_the_source_logs_is_declared():
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if str(path.relative_to(ROOT)) in NOT_METRIC_MODULES:
            continue
        for text, line in keys_in_source(ast.parse(path.read_text())):
            if not declared(text):
                missing.append(f"{path.relative_to(ROOT)}:{line}: {text}")
    assert not missing, (
        "keys the code logs (or reads) that hydrappo/train/metric_keys.py does not declare; add each with its "
        "meaning, then `python -m hydrappo.train.metric_keys > docs/metrics.md`:\n" + "\n".join(missing)
    )


def test_the_scan_finds_the_shapes_the_code_uses():
    source = """
stats = {"env/reward_mean": 1, **{f"env/reward/{name}": 2 for name in names}}
stats["objective/kl"] = 3
out = {("train/loss" if key == "loss" else key): v for key, v in stats.items()}
progress = {"kl": "objective/kl_coef"}
if "eval/solve_rate" in last and last.get("time/eval"):
    path = "outputs/run"
"""
    found = sorted(text for text, _ in keys_in_source(ast.parse(source)))
    assert found == [
        "env/reward/{}",
        "env/reward_mean",
        "eval/solve_rate",
        "objective/kl",
        "objective/kl_coef",
        "time/eval",
        "train/loss",
    ]
    assert declared("env/reward/{}") and declared("policy/clipfrac") and declared("{}val/var_explained")
    assert not declared("policy/made_up") and not declared("env/reward_median")


def test_the_table_is_well_formed():
    seen = set()
    for metric in METRICS:
        assert metric.stages and set(metric.stages) <= set(STAGES), metric
        for stage in metric.stages:
            assert (metric.key, stage) not in seen, f"{metric.key} declared twice for {stage}"
            seen.add((metric.key, stage))
        assert re.fullmatch(r"[\w/]*(\{\w+\}[\w/]*)*", metric.key), metric.key
        assert metric.meaning.endswith(".") and "\n" not in metric.meaning, metric.key
    assert metric_of("env/reward/good_words", ["ppo"]).key == "env/reward/{source}"
    assert metric_of("eval/loss", ["sft"]).stages == ("sft",)
    assert metric_of("eval/loss/sft", ["dpo"]).key == "eval/loss/{type}"
    assert metric_of("ppo/val/mean", ["critic-free"]) is None  # a critic-free run has no value head


def test_docs_page_is_the_table():
    page = (ROOT / "docs" / "metrics.md").read_text()
    assert page == metric_keys.markdown(), "regenerate it: python -m hydrappo.train.metric_keys > docs/metrics.md"


# ----------------------------------------------------------------------------- what tiny runs log
ONE_STEP = ["--total_steps", "1", "--batch_size", "4", "--mini_batch_size", "4", "--ppo_epochs", "1"]
ONE_STEP += ["--max_new_tokens", "4", "--save_every", "100"]


def held_out(tmp: Path) -> str:
    path = tmp / "held_out.jsonl"
    path.write_text("".join((TINY / "prompts.jsonl").read_text().splitlines(keepends=True)[-4:]))
    return str(path)


def ppo_run(tmp: Path) -> Path:
    """A value head, sampled held-out answers (2 each), a TRL-contract reward that logs a metric and
    leaves samples unscored, the dual clip and an entropy bonus."""
    trl_reward = f"{FIXTURES / 'trl_contract_rewards.py'}:good_words"
    options = ["--eval_prompts", held_out(tmp), "--eval_samples_per_prompt", "2", "--eval_greedy", "false"]
    options += ["--reward_fn", trl_reward, "--dual_clip", "3", "--ent_coef", "0.01"]
    tiny_trainer(tmp / "run", *ONE_STEP, *options).train()
    return tmp / "run"


def critic_free_run(tmp: Path) -> Path:
    """GRPO on a verifiable reward, the KL a term of the loss."""
    options = ["--reward_fn", VERIFIABLE, "--samples_per_prompt", "2", "--advantage_estimator", "grpo"]
    tiny_trainer(tmp / "run", *ONE_STEP, *options, "--kl_penalty", "loss").train()
    return tmp / "run"


def agent_run(tmp: Path) -> Path:
    """Tools and an environment with its own reward (critic-free), evaluated on held-out prompts."""
    options = [*agent_run_options(save_tiny_tool_tokenizer(tmp / "tokenizer")), "--eval_prompts", held_out(tmp)]
    tiny_trainer(tmp / "run", *ONE_STEP, "--batch_size", "8", "--mini_batch_size", "8", *options).train()
    return tmp / "run"


def reward_run(tmp: Path) -> Path:
    from hydrappo.train.reward_model import RewardTrainer

    RewardTrainer(reward_config(tmp, max_steps=1)).train()
    return tmp / "reward"


def sft_run(tmp: Path) -> Path:
    from hydrappo.config import SFTConfig, parse_config
    from hydrappo.train.sft import SFTTrainer

    SFTTrainer(parse_config(write_sft_config(tmp, max_steps=1), [], SFTConfig)).train()
    return tmp / "sft"


def dpo_run(tmp: Path) -> Path:
    """A combined loss (sigmoid + sft), whose terms are logged apart."""
    from hydrappo.config import DPOConfig, parse_config
    from hydrappo.train.dpo import DPOTrainer

    dpo = {"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, 0.5]}
    DPOTrainer(parse_config(write_dpo_config(tmp, dpo, max_steps=1), [], DPOConfig)).train()
    return tmp / "dpo"


RUNS = {  # run -> (what it runs, the stages whose keys it may log)
    "ppo": (ppo_run, ("ppo", "eval")),
    "critic-free": (critic_free_run, ("critic-free",)),
    "agent": (agent_run, ("critic-free", "eval")),
    "reward": (reward_run, ("reward",)),
    "sft": (sft_run, ("sft",)),
    "dpo": (dpo_run, ("dpo",)),
}


@pytest.mark.slow
@pytest.mark.parametrize("run", RUNS)
def test_a_tiny_run_logs_only_declared_keys(tmp_path, run):
    make, stages = RUNS[run]
    lines = (make(tmp_path) / "metrics.jsonl").read_text().splitlines()
    keys = {key for line in lines for key in json.loads(line)}
    assert len(keys) > 5, keys
    undeclared = sorted(key for key in keys if metric_of(key, stages) is None)
    assert not undeclared, f"{run} logs keys hydrappo/train/metric_keys.py does not declare for {stages}: {undeclared}"
