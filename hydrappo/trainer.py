"""PPOTrainer: the loop that turns prompts into a trained policy.

One PPO step:
    sample prompts -> generate (policy, KV cache) -> one forward_hydra pass (log-probs,
    reference log-probs, values, split hidden state, [reward-branch score]) -> scores ->
    shaped rewards -> GAE -> whitened advantages -> ppo_epochs x minibatches of
    forward_top on the CACHED split hidden state -> clipped losses -> optimizer step
    -> KL controller update -> logs -> checkpoint.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from pathlib import Path

import numpy as np
import torch
import yaml
from transformers import get_scheduler

from . import checkpoint as ckpt
from .config import Config, ConfigError
from .data import PromptSampler, load_prompt_texts, tokenize_prompts
from .hydra import HydraModel
from .kl import build_kl_controller
from .models import build_hydra
from .precision import MixedPrecision, pick_device, pick_mixed_precision
from .ppo import RunningMoments, gae, masked_mean, normalize_scores, ppo_loss, shape_rewards, whiten
from .rewards import build_reward_source
from .rollout import Experience, evaluate_sequences, generate_responses, pack_sequences

logger = logging.getLogger("hydrappo")


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. too many non-finite steps in a row)."""


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_path(path: str | None, base_dir: Path | None) -> str | None:
    """Relative paths in a config file are relative to that file's folder when the file
    exists there, else to the current directory."""
    if path is None or base_dir is None or Path(path).is_absolute():
        return path
    candidate = base_dir / path
    return str(candidate) if candidate.exists() else path


def enable_activation_checkpointing(model) -> None:
    """transformers renamed gradient checkpointing to activation checkpointing in 5.x."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def resolve_config_paths(config: Config, base_dir: Path | None) -> None:
    """Anchor every relative path of a config file at the file's folder, in place, so the
    config saved with each checkpoint works from any directory."""
    model, reward, data = config.model, config.reward, config.data
    model.name_or_path = resolve_path(model.name_or_path, base_dir)
    model.tokenizer_name_or_path = resolve_path(model.tokenizer_name_or_path, base_dir)
    model.reward_branch_path = resolve_path(model.reward_branch_path, base_dir)
    reward.reward_model = resolve_path(reward.reward_model, base_dir)
    data.prompts = resolve_path(data.prompts, base_dir)
    config.lora.lora_init_adapter = resolve_path(config.lora.lora_init_adapter, base_dir)
    if reward.reward_fn and ".py:" in reward.reward_fn:
        file, _, function = reward.reward_fn.rpartition(":")
        reward.reward_fn = f"{resolve_path(file, base_dir)}:{function}"


def keep_float32_master_weights(hydra: HydraModel, mixed_precision: str) -> None:
    """Trainable parameters of a bf16/fp16 model are kept in float32.

    AdamW on bf16 weights rounds most updates away: a step of 1e-5 on a weight of 0.02 is
    below bf16's resolution there. The frozen trunk stays in low precision (that is where
    the memory is); autocast runs the mixed model, so it must be on."""
    low_precision = [p for p in hydra.trainable_parameters() if p.dtype in (torch.bfloat16, torch.float16)]
    if not low_precision:
        return
    if mixed_precision == "no":
        raise ConfigError(
            f"the model's weights are {low_precision[0].dtype} but train.mixed_precision is 'no': hydrappo keeps the "
            "trainable weights in float32 and needs autocast to run the mixed model. Set train.mixed_precision to "
            "auto/bf16/fp16, or model.dtype to float32."
        )
    for param in low_precision:
        param.data = param.data.float()


class PPOTrainer:
    """PPO-RLHF on one HydraModel.

    Build it from a `Config` (`hydrappo train` does); pass `hydra`/`tokenizer` to use a
    model you built yourself. `config_dir` anchors relative paths of the config file.
    """

    def __init__(self, config: Config, *, hydra: HydraModel | None = None, tokenizer=None, config_dir=None):
        self.config = config
        self.config_dir = Path(config_dir) if config_dir is not None else None
        train, ppo = config.train, config.ppo
        seed_everything(train.seed)

        self.device = pick_device(train.device)
        self.precision = MixedPrecision(pick_mixed_precision(train.mixed_precision, self.device), self.device)

        resolve_config_paths(config, self.config_dir)
        if hydra is None:
            hydra, tokenizer = build_hydra(config.model, config.lora, device=self.device)
        if tokenizer is None:
            raise ValueError("PPOTrainer: pass the tokenizer together with a hydra model.")
        self.hydra, self.tokenizer = hydra, tokenizer
        keep_float32_master_weights(hydra, self.precision.mode)
        if config.model.gradient_checkpointing:
            enable_activation_checkpointing(hydra.model)
        if config.model.reward_branch_path:
            from .reward_trainer import apply_reference_stats, load_reward_branch

            branch = load_reward_branch(hydra, config.model.reward_branch_path)
            hydra.attach_reward_branch(branch)
            # score_normalization 'ref' without explicit statistics: the reward checkpoint's.
            apply_reference_stats(config.reward, branch)

        self.reward_source = build_reward_source(config.reward, base_dir=self.config_dir, device=str(self.device))
        data = config.data
        texts = load_prompt_texts(data.prompts, data.prompt_column)
        self.prompts = tokenize_prompts(
            texts, tokenizer, data.max_prompt_length, data.apply_chat_template, data.system_prompt
        )
        self.sampler = PromptSampler(len(self.prompts.input_ids), train.seed)

        self.optimizer = torch.optim.AdamW(
            hydra.trainable_parameters(),
            lr=ppo.learning_rate,
            betas=(ppo.adam_beta1, ppo.adam_beta2),
            eps=ppo.adam_eps,
            weight_decay=ppo.weight_decay,
        )
        updates_per_step = ppo.ppo_epochs * (ppo.batch_size // ppo.mini_batch_size)
        self.scheduler = get_scheduler(
            {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}[ppo.lr_scheduler],
            self.optimizer,
            num_warmup_steps=ppo.warmup_steps,
            num_training_steps=max(1, train.total_steps * updates_per_step),
        )
        self.kl_controller = build_kl_controller(ppo.kl_controller, ppo.init_kl_coef, ppo.kl_target, ppo.kl_horizon)
        self.score_moments = RunningMoments()
        self.shuffle_generator = torch.Generator().manual_seed(train.seed)
        self.step = 0
        self.nonfinite_in_a_row = 0
        self.nonfinite_total = 0
        self.fp16_overflows = 0
        self.output_dir = Path(train.output_dir)

    # ------------------------------------------------------------------ experience
    def _autocast(self):
        return self.precision.autocast()

    def score(self, prompt_texts: list[str], response_texts: list[str], branch_scores) -> torch.Tensor:
        if self.reward_source is None:
            if branch_scores is None:
                raise TrainingError("reward.use_reward_branch is set but no reward branch is attached.")
            return branch_scores.float().cpu()
        samples = [p + r for p, r in zip(prompt_texts, response_texts)]
        return torch.as_tensor(self.reward_source(samples, prompt_texts, response_texts), dtype=torch.float32)

    @torch.no_grad()
    def make_experience(self) -> tuple[Experience, dict, list[dict]]:
        cfg, ppo, reward_cfg = self.config, self.config.ppo, self.config.reward
        start = time.perf_counter()
        indices = self.sampler.next_batch(ppo.batch_size)
        prompt_ids = [self.prompts.input_ids[i] for i in indices]
        prompt_texts = [self.prompts.texts[i] for i in indices]
        with self._autocast():
            responses = generate_responses(self.hydra, self.tokenizer, prompt_ids, cfg.generation)
        input_ids, attention_mask, action_mask, prompt_width = pack_sequences(
            responses.prompt_ids, responses.response_ids, self.tokenizer.pad_token_id
        )
        evaluation = evaluate_sequences(
            self.hydra,
            input_ids,
            attention_mask,
            prompt_width,
            temperature=cfg.generation.temperature,
            chunk_size=cfg.generation.generation_batch_size,
            autocast=self._autocast,
        )
        response_texts = self.tokenizer.batch_decode(responses.response_ids, skip_special_tokens=True)
        raw_scores = self.score(prompt_texts, response_texts, evaluation.scores)
        if not torch.isfinite(raw_scores).all():
            raise TrainingError(f"the reward source returned non-finite scores: {raw_scores.tolist()}")
        scores = normalize_scores(
            raw_scores,
            reward_cfg.score_normalization,
            moments=self.score_moments,
            ref_mean=reward_cfg.score_ref_mean,
            ref_std=reward_cfg.score_ref_std,
        )
        device = self.device
        action_mask = action_mask.to(device)
        kl_coef = self.kl_controller.value
        rewards, reward_stats = shape_rewards(
            scores.to(device),
            evaluation.logprobs,
            evaluation.ref_logprobs,
            action_mask,
            kl_coef,
            kl_estimator=ppo.kl_estimator,
            kl_in_reward=ppo.kl_penalty == "reward",
            cliprange_reward=reward_cfg.cliprange_reward,
            ended_with_eos=torch.tensor(responses.ended, device=device),
            missing_eos_penalty=reward_cfg.missing_eos_penalty,
        )
        advantages, returns = gae(rewards, evaluation.values, action_mask, ppo.gamma, ppo.lam)
        if ppo.whiten_advantages:
            advantages = whiten(advantages, action_mask)
        experience = Experience(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            action_mask=action_mask,
            split_hidden=evaluation.split_hidden,
            logprobs=evaluation.logprobs,
            ref_logprobs=evaluation.ref_logprobs,
            values=evaluation.values,
            rewards=rewards,
            advantages=advantages,
            returns=returns,
            prompt_width=prompt_width,
        )
        # KL of the sampled sequences, summed over tokens (k1), as the adaptive controller expects.
        sequence_kl = ((evaluation.logprobs - evaluation.ref_logprobs) * action_mask).sum(-1)
        lengths = action_mask.sum(-1)
        stats = {
            "env/reward_mean": raw_scores.mean().item(),
            "env/reward_std": raw_scores.std().item() if len(raw_scores) > 1 else 0.0,
            "env/score_used_mean": scores.mean().item(),
            "env/missing_eos_frac": 1.0 - float(np.mean(responses.ended)),
            "objective/kl": sequence_kl.mean().item(),
            "objective/kl_coef": kl_coef,
            "objective/entropy": masked_mean(evaluation.entropy, action_mask).item(),
            "tokens/responses_len_mean": lengths.mean().item(),
            "tokens/prompts_len_mean": float(np.mean([len(p) for p in prompt_ids])),
            "ppo/returns/mean": masked_mean(returns, action_mask).item(),
            "ppo/advantages/mean": masked_mean(advantages, action_mask).item(),
            "time/rollout": time.perf_counter() - start,
        }
        stats.update({f"objective/{key}": _as_float(value) for key, value in reward_stats.items()})
        samples = [
            {"prompt": p, "response": r, "score": float(s)} for p, r, s in zip(prompt_texts, response_texts, raw_scores)
        ]
        return experience, stats, samples

    # ------------------------------------------------------------------ update
    def ppo_update(self, experience: Experience) -> dict:
        ppo = self.config.ppo
        start = time.perf_counter()
        batch_size = experience.input_ids.shape[0]
        micro_size = ppo.mini_batch_size // ppo.gradient_accumulation_steps
        offset = experience.logprob_offset
        need_entropy = ppo.ent_coef != 0
        params = self.hydra.trainable_parameters()
        totals: dict[str, float] = {}
        counts: dict[str, int] = {}
        updates = 0
        for _ in range(ppo.ppo_epochs):
            order = torch.randperm(batch_size, generator=self.shuffle_generator).to(self.device)
            for mb_start in range(0, batch_size, ppo.mini_batch_size):
                minibatch = order[mb_start : mb_start + ppo.mini_batch_size]
                loss_is_finite = True
                for micro_start in range(0, len(minibatch), micro_size):
                    batch = experience.minibatch(minibatch[micro_start : micro_start + micro_size])
                    with self._autocast():
                        out = self.hydra.forward_top(
                            batch.split_hidden,
                            batch.input_ids,
                            batch.attention_mask,
                            return_entropy=need_entropy,
                            temperature=self.config.generation.temperature,
                            logprobs_from=offset,
                        )
                    loss, stats = ppo_loss(
                        out.logprobs[:, offset:].float(),
                        batch.logprobs,
                        batch.advantages,
                        out.values[:, offset:-1].float(),
                        batch.values,
                        batch.returns,
                        batch.action_mask,
                        cliprange=ppo.cliprange,
                        cliprange_value=ppo.cliprange_value,
                        vf_coef=ppo.vf_coef,
                        ent_coef=ppo.ent_coef,
                        entropy=out.entropy[:, offset:].float() if need_entropy else None,
                        dual_clip=ppo.dual_clip,
                        loss_agg_mode=ppo.loss_agg_mode,
                        ref_logprobs=batch.ref_logprobs if ppo.kl_penalty == "loss" else None,
                        kl_coef=self.kl_controller.value if ppo.kl_penalty == "loss" else 0.0,
                    )
                    if not torch.isfinite(loss):
                        loss_is_finite = False
                        break
                    self.precision.backward(loss / ppo.gradient_accumulation_steps)
                    for key, value in stats.items():
                        # A micro-batch whose returns have no variance has no explained
                        # variance (nan): average over the ones that do.
                        if math.isfinite(_as_float(value)):
                            totals[key] = totals.get(key, 0.0) + _as_float(value)
                            counts[key] = counts.get(key, 0) + 1
                grad_norm = (
                    self.precision.clip_grad_norm_(self.optimizer, params, ppo.max_grad_norm)
                    if loss_is_finite
                    else float("nan")
                )
                if loss_is_finite and math.isfinite(grad_norm):
                    self.precision.step(self.optimizer)
                    self.scheduler.step()
                    self.nonfinite_in_a_row = 0
                    totals["grad_norm"] = totals.get("grad_norm", 0.0) + grad_norm
                    counts["grad_norm"] = counts.get("grad_norm", 0) + 1
                    updates += 1
                elif loss_is_finite and self.precision.mode == "fp16":
                    # An fp16 gradient overflow is the loss scaler's business: it skips this step
                    # and lowers the scale. Not a sign of a diverging run.
                    self.precision.step(self.optimizer)
                    self.fp16_overflows += 1
                else:
                    self._skip_nonfinite_update()
                self.optimizer.zero_grad(set_to_none=True)
        stats = {f"ppo/{key}": value / counts[key] for key, value in totals.items()}
        stats["ppo/updates"] = updates
        stats["ppo/nonfinite_skipped_total"] = self.nonfinite_total
        if self.precision.mode == "fp16":
            stats["ppo/fp16_overflows_total"] = self.fp16_overflows
        stats["lr"] = self.scheduler.get_last_lr()[0]
        stats["time/update"] = time.perf_counter() - start
        return stats

    def _skip_nonfinite_update(self) -> None:
        self.nonfinite_in_a_row += 1
        self.nonfinite_total += 1
        limit = self.config.ppo.max_nonfinite_steps
        logger.warning(
            "non-finite loss or gradient at step %d: update skipped (%d in a row, %d in total)",
            self.step + 1, self.nonfinite_in_a_row, self.nonfinite_total,
        )
        if self.nonfinite_in_a_row >= limit:
            latest = ckpt.latest_checkpoint(self.output_dir)
            raise TrainingError(
                f"{self.nonfinite_in_a_row} non-finite losses or gradients in a row (ppo.max_nonfinite_steps={limit}); "
                f"stopping. The last good checkpoint is {latest or 'none (no checkpoint was written yet)'}. "
                "Lower ppo.learning_rate, check the reward scale (reward.cliprange_reward) or use float32."
            )

    # ------------------------------------------------------------------ the loop
    def train_step(self) -> tuple[dict, list[dict]]:
        # Dropout is off either way; the mode matters because transformers checkpoints layers
        # only in train mode, and turns the KV cache off there: generate in eval mode.
        self.hydra.eval()
        experience, stats, samples = self.make_experience()
        self.hydra.train(self.config.model.gradient_checkpointing)
        stats.update(self.ppo_update(experience))
        self.hydra.eval()
        self.kl_controller.update(stats["objective/kl"], self.config.ppo.batch_size)
        self.step += 1
        return stats, samples

    def train(self, resume: str | Path | bool | None = None) -> list[dict]:
        """Run until train.total_steps; `resume` = a checkpoint path or True/'latest'."""
        train = self.config.train
        if resume:
            self.load(ckpt.resolve_checkpoint(resume, self.output_dir))
        self.output_dir.mkdir(parents=True, exist_ok=True)
        metrics_path = self.output_dir / "metrics.jsonl"
        _keep_metrics_up_to(metrics_path, self.step)

        from torch.utils.tensorboard import SummaryWriter
        from tqdm.auto import tqdm

        # purge_step hides events of an interrupted run past the checkpoint we resumed from.
        writer = SummaryWriter(str(self.output_dir / "tensorboard"), purge_step=self.step + 1 if self.step else None)
        history = []
        bar = tqdm(total=train.total_steps, initial=self.step, desc="PPO", disable=not train.progress_bar, dynamic_ncols=True)
        try:
            while self.step < train.total_steps:
                stats, samples = self.train_step()
                for key, value in stats.items():
                    writer.add_scalar(key, value, self.step)
                if train.log_samples_every and self.step % train.log_samples_every == 0:
                    writer.add_text("samples", _samples_markdown(samples[: train.num_log_samples]), self.step)
                record = {"step": self.step, **stats}
                with metrics_path.open("a") as handle:
                    handle.write(json.dumps(record) + "\n")
                history.append(record)
                bar.update(1)
                bar.set_postfix(reward=f"{stats['env/reward_mean']:.3f}", kl=f"{stats['objective/kl']:.3f}")
                if self.step % train.save_every == 0 or self.step == train.total_steps:
                    self.save()
        finally:
            bar.close()
            writer.close()
        return history

    # ------------------------------------------------------------------ checkpoints
    def save(self) -> Path:
        training_state = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": ckpt.rng_state(),
            "shuffle_generator": self.shuffle_generator.get_state(),
            "grad_scaler": self.precision.state_dict(),
        }
        trainer_state = {
            "kl_controller": self.kl_controller.state_dict(),
            "score_moments": self.score_moments.state_dict(),
            "sampler": self.sampler.state_dict(),
            "nonfinite_total": self.nonfinite_total,
            "hydra": {
                "num_layers_unfrozen": self.hydra.num_layers_unfrozen,
                "train_lm_head": self.hydra.train_lm_head,
                "train_final_norm": self.hydra.train_final_norm,
                "lora": self.hydra.uses_lora,
            },
        }
        return ckpt.save_checkpoint(
            self.output_dir,
            self.step,
            model=self.hydra,
            training_state=training_state,
            trainer_state=trainer_state,
            config_yaml=yaml.safe_dump(self.config.to_dict(), sort_keys=False),
            keep_last=self.config.train.keep_last,
            write_extra=self._save_adapter if self.hydra.uses_lora else None,
        )

    def _save_adapter(self, folder: Path) -> None:
        """LoRA runs also save the adapter in peft's own format, loadable with
        `PeftModel.from_pretrained(base_model, folder / "adapter")`."""
        self.hydra.peft_model.save_pretrained(str(folder / "adapter"))

    def load(self, path: Path) -> None:
        ckpt.load_trainable_weights(self.hydra, path)
        training_state, trainer_state = ckpt.load_training_state(path)
        self.optimizer.load_state_dict(training_state["optimizer"])
        self.scheduler.load_state_dict(training_state["scheduler"])
        ckpt.set_rng_state(training_state["rng"])
        self.shuffle_generator.set_state(training_state["shuffle_generator"])
        self.precision.load_state_dict(training_state.get("grad_scaler", {}))
        self.kl_controller.load_state_dict(trainer_state["kl_controller"])
        self.score_moments.load_state_dict(trainer_state["score_moments"])
        self.sampler.load_state_dict(trainer_state["sampler"])
        self.nonfinite_total = trainer_state.get("nonfinite_total", 0)
        self.step = trainer_state["step"]
        logger.info("resumed from %s at step %d", path, self.step)


def _as_float(value) -> float:
    return float(value.item()) if isinstance(value, torch.Tensor) else float(value)


def _samples_markdown(samples: list[dict]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    rows = ["| prompt | response | score |", "| --- | --- | --- |"]
    rows += [f"| {cell(s['prompt'])} | {cell(s['response'])} | {s['score']:.3f} |" for s in samples]
    return "\n".join(rows)


def _keep_metrics_up_to(path: Path, step: int) -> None:
    """On resume, lines logged after the checkpoint's step belong to the interrupted run:
    move them to a side file (nothing written is lost) so metrics.jsonl reads as one run."""
    if not path.exists():
        return
    kept, dropped = [], []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        (kept if json.loads(line).get("step", 0) <= step else dropped).append(line)
    if dropped:
        side = path.with_name(f"metrics.after-step-{step}.{int(time.time())}.jsonl")
        side.write_text("\n".join(dropped) + "\n")
        path.write_text("".join(line + "\n" for line in kept))
        logger.warning("moved %d metrics lines logged after step %d to %s", len(dropped), step, side.name)
