"""PPOTrainer: the loop that turns prompts into a trained policy.

One PPO step (Ziegler et al. 2019; Ouyang et al. 2022), top to bottom in `train_step`:
    sample prompts -> generate (policy, KV cache) -> one forward_hydra pass (log-probs,
    reference log-probs, values, split hidden state, [reward-branch score]) -> scores ->
    shaped rewards -> GAE -> whitened advantages -> ppo_epochs x minibatches of
    forward_top on the CACHED split hidden state -> clipped losses -> optimizer step
    -> KL controller update.
Seeding, precision, the optimizer, logs, the non-finite policy, checkpoints and resume are
the harness's (train/harness.py).
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from ..algo.advantages import estimate_advantages
from ..algo.kl import build_kl_controller
from ..algo.losses import ppo_loss
from ..algo.masked import masked_mean, masked_sum
from ..algo.scores import RunningMoments, group_statistics, normalize_scores, shape_rewards
from ..config import Config
from ..data import PromptSampler, load_prompt_texts, tokenize_prompts
from ..model import HydraModel
from ..rewards import build_reward_source
from ..rollout import Experience, Responses, evaluate_sequences, generate_responses, pack_sequences, response_part
from ..storage.checkpoint import CheckpointError
from ..storage.reward_branch import apply_reference_stats, load_reward_branch
from .harness import TrainingError, as_float, enable_activation_checkpointing, prepare


class MeanMeter:
    """Running means of per-micro-batch statistics. A statistic that is not finite (the
    explained variance of returns without variance) is left out rather than poisoning the mean."""

    def __init__(self):
        self.totals: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def add(self, stats: dict) -> None:
        for key, value in stats.items():
            value = as_float(value)
            if math.isfinite(value):
                self.totals[key] = self.totals.get(key, 0.0) + value
                self.counts[key] = self.counts.get(key, 0) + 1

    def means(self, prefix: str = "") -> dict:
        return {f"{prefix}{key}": total / self.counts[key] for key, total in self.totals.items()}


class PPOTrainer:
    """PPO-RLHF on one HydraModel.

    Build it from a `Config` (`hydrappo train` does); pass `hydra`/`tokenizer` to use a
    model you built yourself. `config_dir` anchors relative paths of the config file.
    """

    name = "PPO"
    progress = {"reward": "env/reward_mean", "kl": "objective/kl"}

    def __init__(self, config: Config, *, hydra: HydraModel | None = None, tokenizer=None, config_dir=None):
        self.config = config
        ppo, train = config.ppo, config.train
        self.critic = ppo.advantage_estimator == "gae"
        self.harness, hydra, tokenizer = prepare(
            config, train, max_nonfinite_steps=ppo.max_nonfinite_steps, config_dir=config_dir, hydra=hydra,
            tokenizer=tokenizer, lora=config.lora, value_head=self.critic,
        )
        if not self.critic:
            hydra.value_head = None  # critic-free: no value head in the optimizer or the checkpoints
        self.device = self.harness.device
        self.hydra, self.tokenizer = hydra, tokenizer
        if config.model.gradient_checkpointing:
            enable_activation_checkpointing(hydra.model)
        if config.model.reward_branch_path:
            branch = load_reward_branch(hydra, config.model.reward_branch_path)
            hydra.attach_reward_branch(branch)
            # score_normalization 'ref' without explicit statistics: the reward checkpoint's.
            apply_reference_stats(config.reward, branch)

        self.reward_source = build_reward_source(config.reward, device=str(self.device))
        data = config.data
        texts = load_prompt_texts(data.prompts, data.prompt_column, data.split, data.subset)
        self.prompts = tokenize_prompts(texts, tokenizer, data.max_prompt_length, data.apply_chat_template, data.system_prompt)
        self.sampler = PromptSampler(len(self.prompts.input_ids), train.seed)

        updates_per_step = ppo.ppo_epochs * (ppo.batch_size // ppo.mini_batch_size)
        self.harness.setup_optimizer(hydra.trainable_parameters(), ppo, train.total_steps * updates_per_step)
        self.kl_controller = build_kl_controller(ppo.kl_controller, ppo.init_kl_coef, ppo.kl_target, ppo.kl_horizon)
        self.score_moments = RunningMoments()
        self.shuffle_generator = torch.Generator().manual_seed(train.seed)

    @property
    def trained_module(self) -> HydraModel:
        return self.hydra

    def train(self, resume=None) -> list[dict]:
        """Run until train.total_steps; `resume` = a checkpoint path or True/'latest'."""
        return self.harness.run(self, self.config.train.total_steps, resume)

    # ------------------------------------------------------------------ the step
    def train_step(self) -> tuple[dict, list[dict]]:
        # Dropout is off either way; the mode matters because transformers checkpoints layers
        # only in train mode, and turns the KV cache off there: generate in eval mode.
        self.hydra.eval()
        experience, stats, samples = self.make_experience()
        self.hydra.train(self.config.model.gradient_checkpointing)
        stats.update(self.ppo_update(experience))
        self.hydra.eval()
        if "objective/kl" in stats:
            self.kl_controller.update(stats["objective/kl"], self.config.ppo.batch_size)
        return stats, samples

    @torch.no_grad()
    def make_experience(self) -> tuple[Experience, dict, list[dict]]:
        ppo, reward_cfg = self.config.ppo, self.config.reward
        group = self.config.generation.samples_per_prompt
        start = time.perf_counter()
        # batch_size / G distinct prompts, each G times in consecutive rows (one group).
        indices = [i for i in self.sampler.next_batch(ppo.batch_size // group) for _ in range(group)]
        prompt_ids = [self.prompts.input_ids[i] for i in indices]
        prompt_texts = [self.prompts.texts[i] for i in indices]
        responses = self.generate(prompt_ids)
        input_ids, attention_mask, action_mask, prompt_width = pack_sequences(
            responses.prompt_ids, responses.response_ids, self.tokenizer.pad_token_id
        )
        kl_coef = self.kl_controller.value
        # With a KL coefficient of 0 the reference branch never runs.
        evaluation = self.evaluate(input_ids, attention_mask, prompt_width, with_reference=kl_coef != 0)
        response_texts = self.tokenizer.batch_decode(responses.response_ids, skip_special_tokens=True)
        raw_scores = self.score(prompt_texts, response_texts, evaluation.scores)
        scores = normalize_scores(
            raw_scores, reward_cfg.score_normalization, moments=self.score_moments,
            ref_mean=reward_cfg.score_ref_mean, ref_std=reward_cfg.score_ref_std,
        )
        action_mask = action_mask.to(self.device)
        rewards, reward_stats = shape_rewards(
            scores.to(self.device), evaluation.logprobs, evaluation.ref_logprobs, action_mask, kl_coef,
            kl_estimator=ppo.kl_estimator, kl_in_reward=ppo.kl_penalty == "reward",
            cliprange_reward=reward_cfg.cliprange_reward, ended_with_eos=torch.tensor(responses.ended, device=self.device),
            missing_eos_penalty=reward_cfg.missing_eos_penalty,
            group_baseline=group if ppo.advantage_estimator == "reinforce_pp_baseline" else 0,
        )
        advantages, returns = estimate_advantages(
            ppo.advantage_estimator, rewards, evaluation.values, action_mask, group_size=group, gamma=ppo.gamma,
            lam=ppo.lam, whiten_advantages=ppo.whiten_advantages,
        )
        experience = Experience(
            input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device), action_mask=action_mask,
            split_hidden=evaluation.split_hidden, logprobs=evaluation.logprobs, ref_logprobs=evaluation.ref_logprobs,
            values=evaluation.values, rewards=rewards, advantages=advantages, returns=returns, prompt_width=prompt_width,
        )
        stats = {
            "env/reward_mean": raw_scores.mean().item(),
            "env/reward_std": raw_scores.std().item() if len(raw_scores) > 1 else 0.0,
            "env/score_used_mean": scores.mean().item(),
            "env/missing_eos_frac": 1.0 - float(np.mean(responses.ended)),
            **group_statistics(raw_scores, group),
            "objective/kl_coef": kl_coef,
            "objective/entropy": masked_mean(evaluation.entropy, action_mask).item(),
            "tokens/responses_len_mean": action_mask.sum(-1).mean().item(),
            "tokens/prompts_len_mean": float(np.mean([len(p) for p in prompt_ids])),
            "ppo/advantages/mean": masked_mean(advantages, action_mask).item(),
            "time/rollout": time.perf_counter() - start,
        }
        if evaluation.ref_logprobs is not None:
            # KL of the sampled sequences, summed over tokens (k1), as the adaptive controller expects.
            stats["objective/kl"] = masked_sum(evaluation.logprobs - evaluation.ref_logprobs, action_mask, dim=-1).mean().item()
            stats.update({f"objective/{key}": as_float(value) for key, value in reward_stats.items()})
        if returns is not None:
            stats["ppo/returns/mean"] = masked_mean(returns, action_mask).item()
        samples = [
            {"prompt": p, "response": r, "score": float(s)} for p, r, s in zip(prompt_texts, response_texts, raw_scores)
        ]
        return experience, stats, samples

    def generate(self, prompt_ids: list[list[int]]) -> Responses:
        """One sampled response per prompt from the policy."""
        with self.harness.autocast():
            return generate_responses(self.hydra, self.tokenizer, prompt_ids, self.config.generation)

    def evaluate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int, with_reference=True):
        """Log-probs, reference log-probs, values, entropy, split hidden state [and reward-branch
        scores] of the packed rollouts, from one hydra pass per chunk."""
        generation = self.config.generation
        return evaluate_sequences(
            self.hydra, input_ids, attention_mask, prompt_width, temperature=generation.temperature,
            chunk_size=generation.generation_batch_size, autocast=self.harness.autocast, with_reference=with_reference,
        )

    def score(self, prompt_texts: list[str], response_texts: list[str], branch_scores) -> torch.Tensor:
        if self.reward_source is None:
            if branch_scores is None:
                raise TrainingError("reward.use_reward_branch is set but no reward branch is attached.")
            scores = branch_scores.float().cpu()
        else:
            samples = [p + r for p, r in zip(prompt_texts, response_texts)]
            scores = torch.as_tensor(self.reward_source(samples, prompt_texts, response_texts), dtype=torch.float32)
        if not torch.isfinite(scores).all():
            raise TrainingError(f"the reward source returned non-finite scores: {scores.tolist()}")
        return scores

    # ------------------------------------------------------------------ the update
    def ppo_update(self, experience: Experience) -> dict:
        ppo, harness = self.config.ppo, self.harness
        start = time.perf_counter()
        meter, updates = MeanMeter(), 0
        for _ in range(ppo.ppo_epochs):
            for minibatch in experience.minibatches(ppo.mini_batch_size, self.shuffle_generator):
                loss_is_finite = True
                for micro in minibatch.split(ppo.gradient_accumulation_steps):
                    loss, stats = self.minibatch_loss(micro)
                    if not torch.isfinite(loss):
                        loss_is_finite = False
                        break
                    harness.backward(loss / ppo.gradient_accumulation_steps)
                    meter.add(stats)
                grad_norm = harness.optimizer_step(loss_is_finite)
                if grad_norm is not None:
                    meter.add({"grad_norm": grad_norm})
                    updates += 1
        return {
            **meter.means("ppo/"),
            "ppo/updates": updates,
            "ppo/nonfinite_skipped_total": harness.nonfinite_total,
            **harness.optimizer_stats("ppo/"),
            "time/update": time.perf_counter() - start,
        }

    def minibatch_loss(self, batch: Experience) -> tuple[torch.Tensor, dict]:
        """The clipped PPO loss of a (micro-)batch, running only the top layers on its cached split."""
        ppo = self.config.ppo
        with self.harness.autocast():
            out = self.hydra.forward_top(
                batch.split_hidden, batch.input_ids, batch.attention_mask, return_entropy=ppo.ent_coef != 0,
                temperature=self.config.generation.temperature, logprobs_from=batch.prompt_width - 1,
            )
        new = response_part(out, batch.prompt_width)
        kl_in_loss = ppo.kl_penalty == "loss" and self.kl_controller.value != 0
        return ppo_loss(
            new.logprobs, batch.logprobs, batch.advantages, new.values, batch.values, batch.returns, batch.action_mask,
            cliprange=ppo.cliprange, cliprange_high=ppo.cliprange_high, cliprange_value=ppo.cliprange_value,
            vf_coef=ppo.vf_coef, ent_coef=ppo.ent_coef, entropy=new.entropy, dual_clip=ppo.dual_clip,
            loss_agg_mode=ppo.loss_agg_mode, importance_sampling_level=ppo.importance_sampling_level,
            ref_logprobs=batch.ref_logprobs if kl_in_loss else None,
            kl_coef=self.kl_controller.value if kl_in_loss else 0.0,
        )

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        return {
            "advantage_estimator": self.config.ppo.advantage_estimator,
            "shuffle_generator": self.shuffle_generator.get_state(),
            "kl_controller": self.kl_controller.state_dict(),
            "score_moments": self.score_moments.state_dict(),
            "sampler": self.sampler.state_dict(),
            "hydra": {
                "num_layers_unfrozen": self.hydra.num_layers_unfrozen,
                "train_lm_head": self.hydra.train_lm_head,
                "train_final_norm": self.hydra.train_final_norm,
                "lora": self.hydra.uses_lora,
            },
        }

    def load_state_dict(self, state: dict) -> None:
        written_by = state.get("advantage_estimator", "gae")  # checkpoints from before critic-free RL
        if written_by != self.config.ppo.advantage_estimator:
            raise CheckpointError(
                f"the checkpoint was written by a run with ppo.advantage_estimator={written_by!r}, this run uses "
                f"{self.config.ppo.advantage_estimator!r}: resume with the same estimator, or start a new run."
            )
        self.shuffle_generator.set_state(state["shuffle_generator"])
        self.kl_controller.load_state_dict(state["kl_controller"])
        self.score_moments.load_state_dict(state["score_moments"])
        self.sampler.load_state_dict(state["sampler"])

    def write_extra(self, folder) -> None:
        """LoRA runs also save the adapter in peft's own format, loadable with
        `PeftModel.from_pretrained(base_model, folder / "adapter")`."""
        if self.hydra.uses_lora:
            self.hydra.peft_model.save_pretrained(str(folder / "adapter"))
