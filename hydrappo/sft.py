"""Supervised fine-tuning of the top N layers: the first stage of the RLHF pipeline.

    hydrappo sft CONFIG.yaml [--option value ...]

Prompt/response pairs; the loss is the mean negative log-likelihood of the RESPONSE
tokens only (the prompt is given, not learned). The model is the same hydra trunk PPO
uses: the bottom L - N layers stay frozen and run without gradients (once per example
with `train.cache_split_hidden`), and the log-probs come from hydra's chunked code, so
the full (B, T, vocab) logits tensor never exists.

The result is a plain transformers model directory (safetensors weights, config,
tokenizer with its chat template) in `train.output_dir`: point `model.name_or_path` of a
PPO config at it, and PPO's frozen reference is the SFT policy. Because only the top N
layers changed, its frozen bottom is the base model's, so a reward branch trained on
the base model also fits it.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import time
from pathlib import Path

import torch
import yaml

from .config import SFT_SECTIONS, ConfigError, SFTConfig, parse_config, validate_stage
from .data import DataError
from .hydra import HydraModel
from .reward_trainer import (
    MetricsLog, SplitCache, as_float, batches, clip_gradients, encode_prompts, load_table, make_optimizer, setup_stage,
    split_by_prompt, tokenize_responses, total_steps_of,
)
from .rollout import pack_sequences

logger = logging.getLogger("hydrappo")

CONFIG_NAME = "sft_config.yaml"


def response_nll(logprobs: torch.Tensor, action_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(token-mean negative log-likelihood, number of tokens) over the masked response tokens."""
    mask = action_mask.to(logprobs.dtype)
    tokens = mask.sum()
    return -(logprobs * mask).sum() / tokens.clamp(min=1), tokens


def save_model_dir(model, tokenizer, output_dir: str | Path, extra_files: dict[str, str] | None = None) -> Path:
    """`save_pretrained` of model (safetensors) and tokenizer into output_dir, which may
    also hold logs. config.json is removed first and written last, so a folder whose
    writing was interrupted is never taken for a complete model (transformers and
    hydrappo both need config.json); weight files of an older model are removed."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".model.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
        (out / "config.json").unlink(missing_ok=True)
        new = {f.name for f in tmp.iterdir()}
        for old in out.iterdir():
            if old.is_file() and old.name not in new and (old.suffix in (".safetensors", ".bin") or old.name.endswith(".index.json")):
                old.unlink()
        for file in sorted(tmp.iterdir(), key=lambda f: f.name == "config.json"):
            os.replace(file, out / file.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


class SFTTrainer:
    """Supervised fine-tuning of a hydra's policy (its top N layers, optionally the lm_head
    and final norm) on prompt/response pairs."""

    def __init__(self, config: SFTConfig, *, hydra: HydraModel | None = None, tokenizer=None, config_dir=None):
        validate_stage(config)
        if config.model.reward_branch_path:
            raise ConfigError("model.reward_branch_path has no use in sft; remove it.")
        self.config = config
        model = config.model
        self.accelerator, self.hydra, self.tokenizer = setup_stage(
            config, config_dir, hydra, tokenizer, train_lm_head=model.train_lm_head, train_final_norm=model.train_final_norm
        )
        self.device = self.accelerator.device
        hydra, data, train = self.hydra, config.data, config.train
        # Only the policy learns here: the value head is PPO's business.
        hydra.value_head.requires_grad_(False)
        self.params = [p for p in hydra.model.parameters() if p.requires_grad]
        if not self.params:
            raise ConfigError(
                "nothing to train: model.num_layers_unfrozen is 0 and the lm_head is frozen; set num_layers_unfrozen >= 1."
            )
        if model.gradient_checkpointing:
            from .trainer import enable_activation_checkpointing

            enable_activation_checkpointing(hydra.model)

        prompts, prompt_ids, response_ids = self._load(data.train_file, "data.train_file")
        if data.eval_file:
            self.train_set = (prompt_ids, response_ids)
            self.eval_set = self._load(data.eval_file, "data.eval_file")[1:]
        else:
            train_index, eval_index = split_by_prompt(prompts, data.eval_fraction, train.seed)
            pick = lambda rows, index: [rows[i] for i in index]  # noqa: E731
            self.train_set = (pick(prompt_ids, train_index), pick(response_ids, train_index))
            self.eval_set = (pick(prompt_ids, eval_index), pick(response_ids, eval_index))
        if not self.train_set[0]:
            raise DataError("no training examples left after the eval split; lower data.eval_fraction.")
        logger.info("sft: %d training examples, %d held-out examples", len(self.train_set[0]), len(self.eval_set[0]))

        # With the whole model training nothing is frozen to cache.
        self.split_cache = SplitCache(hydra, train.cache_split_hidden and not hydra.full_model)
        self.total_steps = total_steps_of(train, len(self.train_set[0]))
        optimizer, scheduler = make_optimizer(self.params, train, self.total_steps)
        self.optimizer, self.scheduler = self.accelerator.prepare(optimizer, scheduler)
        self.data_generator = torch.Generator().manual_seed(train.seed)
        self.output_dir = Path(train.output_dir)
        self.step = 0

    def _load(self, path, setting):
        data = self.config.data
        table = load_table(path, [data.prompt_column, data.response_column], setting=setting)
        prompts = table[data.prompt_column]
        prompt_ids = encode_prompts(prompts, self.tokenizer, data)
        response_ids = tokenize_responses(table[data.response_column], self.tokenizer, data.max_response_length, data.append_eos)
        return prompts, prompt_ids, response_ids

    def _autocast(self):
        from contextlib import nullcontext

        return self.accelerator.autocast() if self.accelerator.mixed_precision != "no" else nullcontext()

    def response_logprobs(self, keys, prompt_ids, response_ids):
        """Log-probs (B, R) of the response tokens under the policy, and their mask."""
        input_ids, attention_mask, action_mask, width = pack_sequences(prompt_ids, response_ids, self.tokenizer.pad_token_id)
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        # The first response token is predicted at the last prompt column: skip the
        # prompt's positions in the lm_head (hydra's logprobs_from).
        offset = width - 1
        with self._autocast():
            if self.split_cache.enabled:
                split = self.split_cache(keys, input_ids, attention_mask)
                out = self.hydra.forward_top(split, input_ids, attention_mask, logprobs_from=offset)
            else:
                out = self.hydra.forward_hydra(input_ids, attention_mask, return_reference=False, logprobs_from=offset)
        return out.logprobs[:, offset:].float(), action_mask.to(self.device)

    @torch.no_grad()
    def evaluate(self, dataset=None, tag: str = "eval") -> dict:
        """Token-mean response NLL over a (prompt_ids, response_ids) set (default: held out)."""
        prompt_ids, response_ids = self.eval_set if dataset is None else dataset
        if not prompt_ids:
            return {}
        was_training = self.hydra.training
        self.hydra.eval()
        total, tokens = 0.0, 0.0
        for index in batches(len(prompt_ids), self.config.train.eval_batch_size, None):
            logprobs, mask = self.response_logprobs(
                [(tag, i) for i in index], [prompt_ids[i] for i in index], [response_ids[i] for i in index]
            )
            nll, count = response_nll(logprobs, mask)
            total += nll.item() * count.item()
            tokens += count.item()
        self.hydra.train(was_training)
        return {f"{tag}/loss": total / max(tokens, 1.0), f"{tag}/tokens": tokens}

    def train_step(self, index: list[int]) -> dict:
        prompt_ids, response_ids = self.train_set
        self.hydra.train(self.config.model.gradient_checkpointing)
        logprobs, mask = self.response_logprobs(
            [("train", i) for i in index], [prompt_ids[i] for i in index], [response_ids[i] for i in index]
        )
        loss, tokens = response_nll(logprobs, mask)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite SFT loss at step {self.step + 1}; lower train.learning_rate.")
        self.accelerator.backward(loss)
        grad_norm = clip_gradients(self.accelerator, self.params, self.config.train.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.hydra.eval()
        self.step += 1
        return {"train/loss": loss.detach(), "train/tokens": tokens, "train/grad_norm": grad_norm, "lr": self.scheduler.get_last_lr()[0]}

    def train(self) -> list[dict]:
        """Train, evaluate at step 0, per epoch (or eval_every) and at the end, save the model."""
        from tqdm.auto import tqdm

        train = self.config.train
        log = MetricsLog(self.output_dir)
        history = [log.log(0, self.evaluate())] if self.eval_set[0] else []
        bar = tqdm(total=self.total_steps, desc="sft", disable=not train.progress_bar, dynamic_ncols=True)
        start = time.perf_counter()
        try:
            done = False
            while not done:
                epoch_batches = batches(len(self.train_set[0]), train.batch_size, self.data_generator)
                for batch_number, index in enumerate(epoch_batches):
                    stats = self.train_step(index)
                    done = self.step >= self.total_steps
                    if (train.eval_every and self.step % train.eval_every == 0) or batch_number == len(epoch_batches) - 1 or done:
                        stats.update(self.evaluate())
                    history.append(log.log(self.step, stats))
                    bar.update(1)
                    bar.set_postfix(loss=f"{as_float(stats['train/loss']):.3f}")
                    if done:
                        break
            self.save()
        finally:
            bar.close()
            log.close()
        logger.info("sft took %.1f s; model saved to %s", time.perf_counter() - start, self.output_dir)
        return history

    def save(self) -> Path:
        config_yaml = yaml.safe_dump(self.config.to_dict(), sort_keys=False)
        return save_model_dir(self.hydra.model, self.tokenizer, self.output_dir, {CONFIG_NAME: config_yaml})


def sft_command(argv: list[str]) -> int:
    from .cli import config_command_args

    parsed = config_command_args(
        argv, "hydrappo sft",
        "Supervised fine-tuning of the top layers on prompt/response pairs; writes a model directory that "
        "model.name_or_path of a PPO config can point at. Options after the config file override it.",
        sections=SFT_SECTIONS,
    )
    if isinstance(parsed, int):
        return parsed
    args, overrides = parsed
    config = parse_config(args.config, overrides, sections=SFT_SECTIONS, config_cls=SFTConfig)
    trainer = SFTTrainer(config, config_dir=Path(args.config).resolve().parent)
    try:
        history = trainer.train()
    except FloatingPointError as error:
        print(f"hydrappo sft: {error}", file=sys.stderr)
        return 1
    evals = [row for row in history if "eval/loss" in row]
    summary = f", held-out response loss {evals[0]['eval/loss']:.4f} -> {evals[-1]['eval/loss']:.4f}" if evals else ""
    print(f"done: step {trainer.step}{summary}.\nmodel: {trainer.output_dir} (use it as model.name_or_path in a PPO config)")
    return 0
