"""Small runs on the tiny example that several test modules share: a PPO trainer with
overrides, a preference file and a reward-stage config, an SFT config, and the ways a test
kills a run (right after a checkpoint, or in the middle of a step) before resuming it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
import yaml

from hydrappo.config import RewardConfig, parse_config

ROOT = Path(__file__).resolve().parents[2]  # the repository
TINY = ROOT / "examples" / "tiny"
FIXTURES = ROOT / "tests" / "fixtures"
AGENT_FIXTURE = (
    FIXTURES / "agent_tools.py"
)  # tools, an environment (Shelf) and a tool-call parser over the tiny vocabulary
VERIFIABLE = str(FIXTURES / "verifiable_reward.py") + ":first_word_is_good"

# Command-line overrides that make a run on the tiny example quick, by what the test needs of it.
# FAST: batches of 8 responses of at most 4 tokens, one epoch, a checkpoint after every step.
FAST = ["--batch_size", "8", "--mini_batch_size", "8", "--ppo_epochs", "1", "--max_new_tokens", "4"]
FAST += ["--no_progress_bar", "--save_every", "1"]
FAST_ONE_STEP = [*FAST, "--total_steps", "1"]  # FAST, stopping after its first step
# One step of 4 responses, checkpointed only at its end.
FAST_SMALL = ["--total_steps", "1", "--batch_size", "4", "--mini_batch_size", "4", "--ppo_epochs", "1"]
FAST_SMALL += ["--max_new_tokens", "4", "--no_progress_bar"]


def tiny_trainer(output_dir, *overrides):
    """A PPOTrainer on examples/tiny/config.yaml writing into `output_dir`, with command-line overrides."""
    from hydrappo.train.ppo import PPOTrainer

    config = parse_config(TINY / "config.yaml", ["--output_dir", str(output_dir), "--no_progress_bar", *overrides])
    return PPOTrainer(config, config_dir=TINY)


NEUTRAL = [f"n{i}" for i in range(48)]
GOOD = [f"g{i}" for i in range(8)]


def write_pairs(path: Path, pairs_per_prompt: int = 3, seed: int = 0) -> None:
    """Synthetic preferences over the tiny example's vocabulary: of two responses of the
    same length, the one with (at least two) more "good" words g0..g7 is chosen."""
    rng = random.Random(seed)
    prompts = [json.loads(line)["prompt"] for line in (TINY / "prompts.jsonl").read_text().splitlines()]

    def response(good: int, length: int) -> str:
        words = rng.choices(GOOD, k=good) + rng.choices(NEUTRAL, k=length - good)
        rng.shuffle(words)
        return " ".join(words)

    with path.open("w") as handle:
        for prompt in prompts:
            for _ in range(pairs_per_prompt):
                length = rng.randint(4, 8)
                low = rng.randint(0, length - 2)
                high = rng.randint(low + 2, length)
                row = {"prompt": prompt, "chosen": response(high, length), "rejected": response(low, length)}
                handle.write(json.dumps(row) + "\n")


def reward_config(tmp: Path, dtype: str | None = None, **train) -> RewardConfig:
    """A reward stage on synthetic pairs (write_pairs) over the tiny trunk; `dtype`: model.dtype."""
    write_pairs(tmp / "pairs.jsonl")
    options = {
        "output_dir": str(tmp / "reward"),
        "epochs": 2,
        "batch_size": 16,
        "learning_rate": 1e-3,
        "warmup_steps": 5,
        "cache_split_hidden": True,
        "progress_bar": False,
        "seed": 0,
        **train,
    }
    text = yaml.safe_dump(
        {
            # The same random trunk as examples/tiny/config.yaml (random_init from seed 0).
            "model": {
                "name_or_path": str(TINY / "model"),
                "random_init": True,
                "num_layers_unfrozen": 2,
                **({"dtype": dtype} if dtype else {}),
            },
            "data": {
                "train_file": "pairs.jsonl",
                "eval_fraction": 0.2,
                "max_prompt_length": 16,
                "max_response_length": 12,
            },
            "train": options,
        }
    )
    (tmp / "reward.yaml").write_text(text)
    return parse_config(tmp / "reward.yaml", [], config_cls=RewardConfig)


def branch_ppo_config(tmp: Path, branch: Path, reward: dict, **train) -> Path:
    """The tiny example's PPO run (float64) scored by the reward branch at `branch`, with `reward`
    as its reward section and `train` over its train options; output in `tmp`."""
    config = yaml.safe_load((TINY / "config.yaml").read_text())
    config["model"].update(name_or_path=str(TINY / "model"), reward_branch_path=str(branch), dtype="float64")
    config["reward"] = {"use_reward_branch": True, **reward}
    config["data"]["prompts"] = str(TINY / "prompts.jsonl")
    config["train"].update(output_dir=str(tmp), progress_bar=False, **train)
    (tmp / "ppo.yaml").write_text(yaml.safe_dump(config))
    return tmp / "ppo.yaml"


def write_sft_config(tmp: Path, **train) -> Path:
    """Responses map each prompt word n<k> to g<k mod 8>: learnable, and far from what a random model says."""
    prompts = [json.loads(line)["prompt"] for line in (TINY / "prompts.jsonl").read_text().splitlines()]
    with (tmp / "sft.jsonl").open("w") as handle:
        for prompt in prompts:
            response = " ".join(f"g{int(word[1:]) % 8}" for word in prompt.split())
            handle.write(json.dumps({"prompt": prompt, "response": response}) + "\n")
    options = {
        "output_dir": str(tmp / "sft"),
        "epochs": 3,
        "batch_size": 16,
        "learning_rate": 3e-3,
        "cache_split_hidden": True,
        "progress_bar": False,
        **train,
    }
    (tmp / "sft.yaml").write_text(
        yaml.safe_dump(
            {
                "model": {
                    "name_or_path": str(TINY / "model"),
                    "random_init": True,
                    "num_layers_unfrozen": 2,
                    "train_lm_head": True,
                },
                "data": {
                    "train_file": "sft.jsonl",
                    "eval_fraction": 0.2,
                    "max_prompt_length": 16,
                    "max_response_length": 12,
                },
                "train": options,
            }
        )
    )
    return tmp / "sft.yaml"


def write_dpo_config(tmp: Path, dpo: dict | None = None, model: dict | None = None, **train) -> Path:
    """A DPO stage on synthetic pairs (write_pairs) over the tiny trunk: its top 2 layers and lm_head train."""
    write_pairs(tmp / "pairs.jsonl")
    options = {
        "output_dir": str(tmp / "dpo"),
        "epochs": 2,
        "batch_size": 16,
        "learning_rate": 3e-3,
        "cache_split_hidden": True,
        "progress_bar": False,
        **train,
    }
    model = {
        "name_or_path": str(TINY / "model"),
        "random_init": True,
        "num_layers_unfrozen": 2,
        "train_lm_head": True,
        **(model or {}),
    }
    if "trainable_layers" in model:  # a band instead of the top layers
        model.pop("num_layers_unfrozen")
    text = {
        "model": model,
        "data": {"train_file": "pairs.jsonl", "eval_fraction": 0.2, "max_prompt_length": 16, "max_response_length": 12},
        "train": options,
        "dpo": {"beta": 0.1, **(dpo or {})},
    }
    (tmp / "dpo.yaml").write_text(yaml.safe_dump(text))
    return tmp / "dpo.yaml"


class Killed(Exception):
    pass


def kill_after_next_save(trainer, monkeypatch) -> None:
    """Make `trainer` die in the update of the step after its next checkpoint is written."""
    real_save = trainer.harness.save

    def save_then_die(loop):
        real_save(loop)
        monkeypatch.setattr(trainer.ppo_step, "ppo_update", lambda experience, plan: (_ for _ in ()).throw(Killed()))

    monkeypatch.setattr(trainer.harness, "save", save_then_die)


def kill_during_step(trainer, monkeypatch, step: int) -> None:
    """The process dies in the middle of `step`: after it consumed random numbers and moved
    the weights in memory, before its metrics line or any checkpoint of it was written."""
    real_step = trainer.train_step

    def train_step():
        result = real_step()
        if trainer.harness.step + 1 == step:
            raise Killed
        return result

    monkeypatch.setattr(trainer, "train_step", train_step)


def same_parameters(a: torch.nn.Module, b: torch.nn.Module) -> None:
    """Every parameter of `a` equals `b`'s, bit for bit."""
    pairs = list(zip(a.named_parameters(), b.named_parameters()))
    assert pairs
    for (name, x), (_, y) in pairs:
        assert torch.equal(x, y), name


# A chat template over the tiny model's vocabulary for multi-turn runs: a turn is its role's word,
# its content and <eos>.
TINY_TOOL_TEMPLATE = (
    "{% for m in messages %}{{ {'system': 'n0', 'user': 'n1', 'assistant': 'n2', 'tool': 'n4'}[m['role']] }} "
    "{{ m['content'] }} <eos> {% endfor %}{% if add_generation_prompt %}n2{% endif %}"
)


def save_tiny_tool_tokenizer(folder: Path) -> Path:
    """The tiny model's tokenizer with TINY_TOOL_TEMPLATE, saved in `folder` (for --tokenizer_name_or_path)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(TINY / "model")
    tokenizer.chat_template = TINY_TOOL_TEMPLATE
    tokenizer.save_pretrained(folder)
    return folder


def agent_run_options(tokenizer_dir: Path) -> list[str]:
    """Options that make a tiny run multi-turn: GRPO over 4 episodes per prompt, the Shelf
    environment's tools and reward, at most 2 rounds of calls in 40 tokens."""
    return [
        "--tokenizer_name_or_path",
        str(tokenizer_dir),
        "--samples_per_prompt",
        "4",
        "--advantage_estimator",
        "grpo",
        "--stop_token_ids",
        *map(str, range(20, 44)),
        "--environment_factory",
        f"{AGENT_FIXTURE}:Shelf",
        "--tool_call_parser",
        f"{AGENT_FIXTURE}:parse",
        "--max_tool_calling_iterations",
        "2",
        "--max_episode_tokens",
        "40",
    ]
