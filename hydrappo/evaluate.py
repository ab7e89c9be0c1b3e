"""Generate for a prompts file, score with a reward function, compare models side by side.

    hydrappo generate CHECKPOINT --prompts eval_prompts.jsonl [--reward_fn file.py:fn]

prints the base model's and the trained policy's responses with their scores and the
mean of each (like trlX's GPT / SFT / PPO comparison). The base model's answers come
from the same trunk before the checkpoint's weights are loaded into it, so only one
model is in memory.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

import torch
import yaml

from .config import SECTIONS, Config, ConfigError, GenerationArgs
from .data import PromptSet, load_prompt_texts, tokenize_prompts
from .rewards import build_reward_source
from .rollout import generate_responses


def generate_and_score(hydra, tokenizer, prompts: PromptSet, generation: GenerationArgs, reward_source, seed: int = 0):
    """One sampled response per prompt, and its score. Seeded, so that two models
    compared on the same prompts see the same random numbers."""
    torch.manual_seed(seed)
    was_training = hydra.training
    hydra.eval()
    responses = generate_responses(hydra, tokenizer, prompts.input_ids, generation)
    hydra.train(was_training)
    texts = tokenizer.batch_decode(responses.response_ids, skip_special_tokens=True)
    scores = [None] * len(texts)
    if reward_source is not None:
        samples = [p + r for p, r in zip(prompts.texts, texts)]
        scores = [float(s) for s in reward_source(samples, prompts.texts, texts)]
    return [
        {"prompt": p, "response": r, "score": s, "ended": e}
        for p, r, s, e in zip(prompts.texts, texts, scores, responses.ended)
    ]


def mean_score(rows: list[dict]) -> float | None:
    scores = [row["score"] for row in rows if row["score"] is not None]
    return statistics.fmean(scores) if scores else None


def side_by_side_markdown(columns: dict[str, list[dict]]) -> str:
    """A markdown table: one row per prompt, a response and score column per model."""

    def cell(text) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    names = list(columns)
    header = "| prompt | " + " | ".join(f"{name} | score" for name in names) + " |"
    lines = [header, "|" + " --- |" * (1 + 2 * len(names))]
    for index, first in enumerate(columns[names[0]]):
        parts = [cell(first["prompt"])]
        for name in names:
            row = columns[name][index]
            parts += [cell(row["response"]), "" if row["score"] is None else f"{row['score']:.3f}"]
        lines.append("| " + " | ".join(parts) + " |")
    means = [mean_score(columns[name]) for name in names]
    lines.append("| **mean** | " + " | ".join(f" | {'' if m is None else f'**{m:.3f}**'}" for m in means) + " |")
    return "\n".join(lines)


def side_by_side_text(columns: dict[str, list[dict]], width: int = 60) -> str:
    """The same comparison for a terminal: blocks per prompt, then the means."""
    import textwrap

    out = []
    for index, first in enumerate(columns[next(iter(columns))]):
        out.append(f"[{index + 1}] {first['prompt']}")
        for name, rows in columns.items():
            row = rows[index]
            score = "" if row["score"] is None else f"{row['score']:+.3f}"
            wrapped = textwrap.fill(row["response"].strip().replace("\n", " "), width) or "(empty)"
            out.append(textwrap.indent(f"{name} {score}\n{textwrap.indent(wrapped, '  ')}", "    "))
        out.append("")
    for name, rows in columns.items():
        value = mean_score(rows)
        out.append(f"mean score {name}: {'n/a' if value is None else f'{value:.3f}'} over {len(rows)} prompts")
    return "\n".join(out)


def load_checkpoint_config(checkpoint: Path) -> Config:
    """The configuration a checkpoint was trained with (its config.yaml)."""
    path = Path(checkpoint) / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"{checkpoint} has no config.yaml: is it a hydrappo checkpoint folder (checkpoint-<step>)?")
    data = yaml.safe_load(path.read_text()) or {}
    sections = {}
    for name, cls in SECTIONS.items():
        valid = {f.name for f in dataclasses.fields(cls)}
        sections[name] = cls(**{k: v for k, v in (data.get(name) or {}).items() if k in valid})
    return Config(**sections)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hydrappo generate",
        description="Generate with a checkpoint's policy (and its base model) for a prompts file, score the responses "
        "and print them side by side with the mean score of each.",
    )
    parser.add_argument("checkpoint", help="a checkpoint folder (output_dir/checkpoint-<step>)")
    parser.add_argument("--prompts", help="prompts file (default: the training prompts)")
    parser.add_argument("--prompt_column", default=None)
    parser.add_argument("--reward_fn", help="'module:function' or 'file.py:function' (default: the training reward)")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N prompts")
    parser.add_argument("--max_new_tokens", type=int, default=None)
    parser.add_argument("--temperature", type=float, default=None)
    parser.add_argument("--no_base", action="store_true", help="skip the base model's responses")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", help="also write the comparison to FILE (.md table or .jsonl rows)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .checkpoint import load_trainable_weights, resolve_checkpoint
    from .models import build_hydra
    from .precision import pick_device
    from .trainer import seed_everything

    checkpoint = resolve_checkpoint(args.checkpoint, Path(args.checkpoint).parent)
    config = load_checkpoint_config(checkpoint)
    generation = dataclasses.replace(
        config.generation,
        max_new_tokens=args.max_new_tokens or config.generation.max_new_tokens,
        temperature=args.temperature if args.temperature is not None else config.generation.temperature,
    )
    reward_args = dataclasses.replace(config.reward, reward_model=None, use_reward_branch=False, reward_fn=None)
    reward_args.reward_fn = args.reward_fn or config.reward.reward_fn
    if not reward_args.reward_fn and config.reward.reward_model:
        reward_args.reward_model = config.reward.reward_model
    device = pick_device(config.train.device)
    # Random-init models are rebuilt from the run's seed, exactly as the trainer built them.
    seed_everything(config.train.seed)
    hydra, tokenizer = build_hydra(config.model, config.lora, device=device)
    reward_source = build_reward_source(reward_args, device=str(device)) if (reward_args.reward_fn or reward_args.reward_model) else None
    data = config.data
    texts = load_prompt_texts(args.prompts or data.prompts, args.prompt_column or data.prompt_column)
    texts = texts[: args.limit] if args.limit else texts
    prompts = tokenize_prompts(texts, tokenizer, data.max_prompt_length, data.apply_chat_template, data.system_prompt)

    columns = {}
    if not args.no_base:
        columns["base"] = generate_and_score(hydra, tokenizer, prompts, generation, reward_source, args.seed)
    load_trainable_weights(hydra, checkpoint)
    columns[f"trained ({checkpoint.name})"] = generate_and_score(hydra, tokenizer, prompts, generation, reward_source, args.seed)

    print(side_by_side_text(columns))
    if args.output:
        write_comparison(columns, Path(args.output))
        print(f"wrote {args.output}")
    return 0


def write_comparison(columns: dict[str, list[dict]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".jsonl":
        with path.open("w") as handle:
            for name, rows in columns.items():
                for row in rows:
                    handle.write(json.dumps({"model": name, **row}) + "\n")
    else:
        path.write_text(side_by_side_markdown(columns) + "\n")


if __name__ == "__main__":
    sys.exit(main())


# ---------------------------------------------------------------------------- several models
def load_for_generation(spec: str, device):
    """A model to sample from: a hydrappo checkpoint (its trained policy), or a model
    directory / bundled name (loaded as is). Returns (name, model, tokenizer, config|None)."""
    from .checkpoint import load_trainable_weights
    from .config import ModelConfig
    from .models import build_hydra, load_model_and_tokenizer
    from .trainer import seed_everything

    name, _, path = spec.rpartition("=") if "=" in spec else ("", "", spec)
    checkpoint = Path(path)
    if (checkpoint / "trainer_state.json").is_file():
        config = load_checkpoint_config(checkpoint)
        seed_everything(config.train.seed)
        hydra, tokenizer = build_hydra(config.model, config.lora, device=device)
        load_trainable_weights(hydra, checkpoint)
        return name or f"{checkpoint.parent.name}/{checkpoint.name}", hydra, tokenizer, config
    model, tokenizer = load_model_and_tokenizer(ModelConfig(name_or_path=path), device=device)
    return name or Path(path).name, model, tokenizer, None


def side_by_side_html(columns: dict[str, list[dict]]) -> str:
    import html

    names = list(columns)
    head = "<tr><th>prompt</th>" + "".join(f"<th>{html.escape(n)}</th><th>score</th>" for n in names) + "</tr>"
    rows = []
    for index, first in enumerate(columns[names[0]]):
        cells = [f"<td>{html.escape(first['prompt'])}</td>"]
        for name in names:
            row = columns[name][index]
            score = "" if row["score"] is None else f"{row['score']:.3f}"
            cells += [f"<td>{html.escape(row['response'])}</td>", f"<td>{score}</td>"]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    means = "".join(f"<td></td><td><b>{'' if mean_score(columns[n]) is None else f'{mean_score(columns[n]):.3f}'}</b></td>" for n in names)
    rows.append(f"<tr><td><b>mean</b></td>{means}</tr>")
    return f"<table border=1 cellpadding=4>\n{head}\n" + "\n".join(rows) + "\n</table>\n"


def compare_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hydrappo compare",
        description="Several models (base, SFT, PPO checkpoints, exported directories) on the same prompts, with "
        "the same sampling seed: responses and reward scores side by side, and the mean score of each.",
    )
    parser.add_argument("models", nargs="+", help="checkpoint folders or model directories, optionally NAME=PATH")
    parser.add_argument("--prompts", required=True, help="prompts file (jsonl/csv/parquet/txt)")
    parser.add_argument("--prompt_column", default="prompt")
    parser.add_argument("--reward_fn", help="'module:function' or 'file.py:function' (default: the first checkpoint's)")
    parser.add_argument("--chat_template", choices=["auto", "yes", "no"], default="auto",
                        help="wrap prompts with each model's chat template (auto: as the first checkpoint was trained)")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--max_new_tokens", type=int, default=None)
    parser.add_argument("--temperature", type=float, default=None)
    parser.add_argument("--max_prompt_length", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", help="also write the table to FILE (.md, .html or .jsonl)")
    args = parser.parse_args(argv)

    from .config import RewardArgs
    from .precision import pick_device

    device = pick_device("auto")
    loaded = [load_for_generation(spec, device) for spec in args.models]
    trained_config = next((config for *_, config in loaded if config is not None), None)
    defaults = trained_config or Config()
    generation = dataclasses.replace(
        defaults.generation,
        max_new_tokens=args.max_new_tokens or defaults.generation.max_new_tokens,
        temperature=args.temperature if args.temperature is not None else defaults.generation.temperature,
    )
    chat = {"yes": True, "no": False, "auto": defaults.data.apply_chat_template}[args.chat_template]
    reward_spec = args.reward_fn or (trained_config.reward.reward_fn if trained_config else None)
    reward_source = build_reward_source(RewardArgs(reward_fn=reward_spec), device=str(device)) if reward_spec else None
    texts = load_prompt_texts(args.prompts, args.prompt_column)
    texts = texts[: args.limit] if args.limit else texts
    max_prompt_length = args.max_prompt_length or defaults.data.max_prompt_length

    columns = {}
    for name, model, tokenizer, _ in loaded:
        prompts = tokenize_prompts(texts, tokenizer, max_prompt_length, chat, defaults.data.system_prompt)
        columns[name] = generate_and_score(model, tokenizer, prompts, generation, reward_source, args.seed)
    print(side_by_side_text(columns))
    if args.output:
        path = Path(args.output)
        if path.suffix == ".html":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(side_by_side_html(columns))
        else:
            write_comparison(columns, path)
        print(f"wrote {path}")
    return 0
