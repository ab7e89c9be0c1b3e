"""One PPO iteration, top to bottom (Ziegler et al. 2019; Ouyang et al. 2022), as CleanRL's ppo.py
reads: `PPOStep.train_step` runs

    1. sample   this process's share of the prompts, G responses each, packed and passed through
                the hydra once (log-probs, reference log-probs, values, the split hidden state,
                the reward branch's score)
    2. score    the reward sources' weighted sum
    3. shape    over the WHOLE batch (every process's rows gathered): score normalisation, the
                overlong penalty, the KL penalty, advantages (and returns); each process keeps its
                own rows of the result
    4. update   ppo_epochs x minibatches of forward_top on the CACHED split hidden state
                (rows that share a prompt pass it once: ppo.share_prompts), clipped losses,
                an optimizer step each
    5. log      the batch's and the update's statistics; the KL controller takes the step's KL

and the methods below follow in that order. The math is algo/'s pure functions; what the step
runs is decided once at its start (StepPlan); the data passed between the stages are the small
dataclasses below, returned by one stage and handed to the next (no stage leaves data on the
object for another to read). Everything the step reads is passed to its constructor by name;
what it owns (the running score moments, the minibatch shuffle generator) it creates, and
`state_dict` / `load_state_dict` carry them (with the prompt sampler's and the KL controller's)
through a checkpoint. PPOTrainer (train/ppo/trainer.py) builds it, and keeps held-out evaluation
and checkpoints.

Under torchrun / accelerate launch (train/distributed.py) `ppo.batch_size` and
`ppo.mini_batch_size` stay GLOBAL counts of responses: every process draws the same prompts,
keeps its contiguous share of whole groups (a prompt's G samples never split), generates and
scores them; the per-token results are gathered so that score normalisation, reward shaping,
advantages (and their whitening) and the logged statistics are computed over the whole batch,
identically on every process; each then updates on its own rows, every loss divided by its
whole minibatch's count, and the gradients are summed. The result does not depend on the
number of processes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ...agent.episodes import Agent
from ...agent.rollouts import environment_scores, episode_columns, gathered_statistics
from ...algo.advantages import estimate_advantages
from ...algo.degeneration import degeneration_flags
from ...algo.kl import KLController
from ...algo.losses import PolicyTokens, aggregation_weights, ppo_loss
from ...algo.masked import explained_variance_parts, masked_mean, masked_sum
from ...algo.scores import (
    RunningMoments,
    fill_unscored,
    group_statistics,
    normalize_scores,
    overlong_filter,
    overlong_penalty,
    shape_rewards,
)
from ...config import Config
from ...data import PromptSampler, PromptSet
from ...generation.responses import Responses
from ...model import HydraModel
from ...rewards import RewardContext, RewardSources, with_columns
from ...rewards.models import ensemble_parts
from ..harness import Harness, TrainingError
from ..memory import BackOff, OutOfMemory, memory_phase
from ..run_log import as_float
from ...data import pack_sequences
from ..sequences import Rollout, experience_pass, pack_split_hidden, response_part
from .experience import Experience, minibatch_plan
from .step_plan import StepPlan
from .update_meter import EXPLAINED_VARIANCE_PARTS, UpdateMeter


@dataclass
class Scored:
    """What scoring gives this process's rows: the total the loss uses, each reward source's own
    scores, and the statistics of the environments' own rewards (agent episodes)."""

    total: torch.Tensor  # (B,) the sources' weighted sum [+ the environments' get_reward()]; NaN: unscored
    parts: dict[str, torch.Tensor]  # source name -> (B,) its unweighted scores
    environment_stats: dict  # env/reward/<environment class>: mean, with an agent whose environments score


@dataclass
class WholeBatch:
    """The whole batch, every process's rows gathered (the same on every process), (N, R) per
    token: what the rewards and advantages are computed over."""

    mask: torch.Tensor  # 1 on response tokens
    logprobs: torch.Tensor
    ref_logprobs: torch.Tensor | None  # None where the reference did not run
    values: torch.Tensor | None  # None without a critic
    entropy: torch.Tensor
    raw_scores: torch.Tensor  # (N,) the reward sources' weighted sum
    ended: torch.Tensor  # (N,) bool: stopped by a stop token or string, not by length
    degenerate: torch.Tensor  # (N,) 1.0 where the response ends in a loop
    prompt_lengths: torch.Tensor  # (N,)
    parts: dict[str, torch.Tensor]  # (N,) each reward source's own scores, when there are several
    unscored: torch.Tensor | None = None  # (N,) bool: no reward source scored the sample (TRL's None)


@dataclass
class Shaped:
    """The whole batch's scores turned into what the loss reads."""

    scores: torch.Tensor  # (N,) normalised, with the overlong penalty
    length_penalty: torch.Tensor  # (N,) DAPO's overlong penalty
    rewards: torch.Tensor  # (N, R) per-token rewards
    reward_stats: dict  # shape_rewards' statistics
    advantages: torch.Tensor  # (N, R)
    returns: torch.Tensor | None  # (N, R) value targets; None without a critic
    loss_mask: torch.Tensor  # (N, R) the tokens the loss counts


class PPOStep:
    """One PPO iteration, built from everything it reads (PPOTrainer builds it for a run; a test can
    build it from small objects).

    - hydra, tokenizer, config, harness: the model, its tokenizer, the run's options, the run's
      plumbing (device, precision, optimizer, process group, the step count)
    - prompts: the tokenized prompt table; prompt_rows: its rows as the data holds them (text or
      messages, what an agent's episodes start from); columns: its other columns, {name: values}
    - sampler: which prompt rows each step draws; rollout_sampler: how responses are sampled
      (generation/samplers.py); records_split: whether sampling records the split hidden states
    - rewards: the reward sources; reward_context: what TRL's reward contract adds to their calls
    - agent: multi-turn episodes with tools / environments, or None
    - kl_controller: the KL coefficient, steered after every step
    - backoff: train.oom_backoff's budget (train/memory.py): an update that runs out of memory
      retries its minibatch in smaller micro-batches while it lasts
    """

    def __init__(
        self,
        *,
        hydra: HydraModel,
        tokenizer,
        config: Config,
        harness: Harness,
        prompts: PromptSet,
        prompt_rows: list,
        columns: dict[str, list],
        sampler: PromptSampler,
        rollout_sampler,
        records_split: bool,
        rewards: RewardSources,
        reward_context: RewardContext,
        agent: Agent | None,
        kl_controller: KLController,
        backoff: BackOff,
    ):
        self.hydra, self.tokenizer, self.config, self.harness = hydra, tokenizer, config, harness
        self.prompts, self.prompt_rows, self.columns, self.sampler = prompts, prompt_rows, columns, sampler
        self.rollout_sampler, self.records_split = rollout_sampler, records_split
        self.rewards, self.reward_context, self.agent = rewards, reward_context, agent
        self.kl_controller, self.backoff = kl_controller, backoff
        # What the step owns, and a checkpoint keeps (state_dict).
        self.score_moments = RunningMoments()  # reward.score_normalization's running statistics
        self.shuffle_generator = torch.Generator().manual_seed(config.train.seed)  # the minibatches' order

    @property
    def device(self) -> torch.device:
        return self.harness.device

    def run(self) -> tuple[dict, list[dict]]:
        """One iteration: (the step's statistics, its sample rows)."""
        plan = self.step_plan()
        # Dropout is off either way; the mode matters because transformers checkpoints layers
        # only in train mode, and turns the KV cache off there: generate in eval mode.
        self.hydra.eval()
        experience, stats, samples = self.make_experience(plan)  # 1. sample, 2. score, 3. shape
        metrics, extras = self.reward_context.take()  # what the reward functions logged (TRL's log_metric, log_extra)
        stats.update(metrics)
        samples = with_columns(samples, extras)
        self.hydra.train(self.config.model.gradient_checkpointing)
        stats.update(self.ppo_update(experience, plan))  # 4. update
        self.hydra.eval()
        if stats["ppo/updates"] and not plan.critic_only:  # the warm-up updates the value head alone
            self.rollout_sampler.weights_changed()
        if plan.reference:  # 5. log (the harness writes it); the controller takes the KL measured
            self.kl_controller.update(stats["objective/kl"], self.config.ppo.batch_size)
        return stats, samples

    def state_dict(self) -> dict:
        return {
            "shuffle_generator": self.shuffle_generator.get_state(),
            "kl_controller": self.kl_controller.state_dict(),
            "score_moments": self.score_moments.state_dict(),
            "sampler": self.sampler.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.shuffle_generator.set_state(state["shuffle_generator"])
        self.kl_controller.load_state_dict(state["kl_controller"])
        self.score_moments.load_state_dict(state["score_moments"])
        self.sampler.load_state_dict(state["sampler"])

    def step_plan(self) -> StepPlan:
        """What the next step runs (train/step_plan.py), at the KL coefficient the controller holds now."""
        group_size = self.config.generation.samples_per_prompt
        return StepPlan.for_step(self.config.ppo, group_size, self.kl_controller.value, self.harness.step)

    @torch.no_grad()
    def make_experience(self, plan: StepPlan) -> tuple[Experience, dict, list[dict]]:
        """Sample, score, shape and estimate one PPO batch: (this process's rows, stats, samples)."""
        start = time.perf_counter()
        rollout = self.rollout(plan)
        with self.harness.dist.phase("scoring responses"), memory_phase("scoring", responses=len(rollout.indices)):
            scored = self.score_rollout(rollout)
        batch = self.gather_batch(rollout, scored)
        # A sample no reward scored (NaN, TRL's None) takes its group's scored mean and leaves the loss.
        batch.raw_scores, batch.unscored = fill_unscored(batch.raw_scores, plan.group_size)
        shaped = self.shape(batch, plan)
        experience = self.experience_rows(rollout, shaped)
        stats = {**self.rollout_statistics(batch, shaped, plan), "time/rollout": time.perf_counter() - start}
        if self.agent is not None:  # the whole batch's episodes: tool calls, their validity, turns
            stats |= gathered_statistics(rollout.responses, self.harness.dist.gather_rows) | scored.environment_stats
        texts = zip(rollout.prompt_texts, rollout.response_texts, scored.total)
        return (
            experience,
            stats,
            [{"prompt": p, "response": r, "score": float(s)} for p, r, s in texts],
        )  # (NaN: unscored)

    # ------------------------------------------------------------------ 1. sample
    def rollout(self, plan: StepPlan) -> Rollout:
        """This process's share of the batch's prompts, each sampled G times (one group in
        consecutive rows), packed and passed through the hydra once (log-probs, reference,
        values, the reward branch)."""
        dist, group = self.harness.dist, plan.group_size
        # With a sharded trunk generation and evaluation hold collectives (FSDP's gathers), which a
        # phase must not: a failure there ends the others through the process group instead.
        with dist.phase("generating responses", enabled=not self.harness.trunk_sharded):
            # Every process draws the same prompts and keeps its share of them: the order of the
            # prompts does not depend on the number of processes.
            drawn = self.sampler.next_batch(self.config.ppo.batch_size // group)
            indices = [i for i in dist.shard(drawn) for _ in range(group)]
            generation = self.config.generation
            with memory_phase(
                "sampling",
                responses=len(indices),
                generation_batch_size=generation.generation_batch_size,
                max_new_tokens=generation.max_new_tokens,
            ):
                responses = self.generate([self.prompts.input_ids[i] for i in indices], indices)
            input_ids, attention_mask, action_mask, prompt_width = pack_sequences(
                responses.prompt_ids, responses.response_ids, self.tokenizer.pad_token_id, responses.policy_mask
            )
            split = pack_split_hidden(responses, prompt_width, input_ids.shape[1])  # recorded while sampling, or None
            responses.split_hidden = None  # the per-row copies: packed now
            with memory_phase(
                "the experience pass",
                sequences=input_ids.shape[0],
                tokens=input_ids.shape[1],
                generation_batch_size=generation.generation_batch_size,
            ):
                evaluation = self.experience_pass(
                    input_ids, attention_mask, prompt_width, with_reference=plan.reference, split_hidden=split
                )
        return Rollout(
            indices=indices,
            prompt_texts=[self.prompts.texts[i] for i in indices],
            responses=responses,
            response_texts=self.texts_of(responses),
            input_ids=input_ids,
            attention_mask=attention_mask,
            action_mask=action_mask.to(self.device),
            prompt_width=prompt_width,
            evaluation=evaluation,
        )

    def generate(self, prompt_ids: list[list[int]], indices=None) -> Responses:
        """One sampled response per prompt from the policy (generation/samplers.py), or with an
        agent one episode per prompt row `indices` (agent/episodes.py)."""
        with self.harness.autocast():
            if self.agent is not None:
                sample, step = self.rollout_sampler.sample, self.harness.step + 1
                return self.agent.play(
                    sample, self.prompt_rows, self.columns, indices, step=step, record_split=self.records_split
                )
            return self.rollout_sampler.sample(prompt_ids, self.config.generation, record_split=self.records_split)

    def texts_of(self, responses: Responses) -> list[str]:
        """What the rewards read as the completions: the response, or an episode's final reply."""
        if responses.final_texts is not None:
            return list(responses.final_texts)
        return self.tokenizer.batch_decode(responses.response_ids, skip_special_tokens=True)

    def experience_pass(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        prompt_width: int,
        with_reference=True,
        split_hidden=None,
    ):
        """Log-probs, reference log-probs, values, entropy, split hidden state [and reward-branch
        scores] of the packed rollouts, from one hydra pass per chunk (of the branches alone
        when sampling recorded the `split_hidden`)."""
        generation = self.config.generation
        return experience_pass(
            self.hydra,
            input_ids,
            attention_mask,
            prompt_width,
            temperature=generation.temperature,
            chunk_size=generation.generation_batch_size,
            autocast=self.harness.autocast,
            with_reference=with_reference,
            split_hidden=split_hidden,
            share_prompts=self.config.ppo.share_prompts,
        )

    # ------------------------------------------------------------------ 2. score
    def score_rollout(self, rollout: Rollout) -> Scored:
        """The reward sources' weighted sum for this process's rows, with their dataset columns."""
        columns = {name: [values[i] for i in rollout.indices] for name, values in self.columns.items()}
        messages = [self.prompts.messages[i] for i in rollout.indices] if self.prompts.messages else None
        return self.score(
            rollout.prompt_texts,
            rollout.response_texts,
            rollout.evaluation.scores,
            columns,
            rollout.responses.response_ids,
            messages,
            row_names=[f"data.prompts row {i}" for i in rollout.indices],
            responses=rollout.responses,
        )

    def score(
        self,
        prompt_texts: list[str],
        response_texts: list[str],
        branch_scores,
        columns=None,
        completion_ids=None,
        messages=None,
        step=None,
        row_names=None,
        responses: Responses | None = None,
    ) -> Scored:
        """The weighted sum of every reward source's scores of this process's rows (rewards.RewardSources),
        with each source's own scores and the environments' statistics;
        `messages`: the rows' prompts as message lists, when the prompt column holds them (prompts.py).
        `step` (default: the step in progress) and `row_names` (each row's table and row) go into a failing
        source's error."""
        samples = [p + r for p, r in zip(prompt_texts, response_texts)]
        step = self.harness.step + 1 if step is None else step
        self.reward_context.trainer_state.global_step = self.harness.step  # TRL's: the steps done
        if self.agent is not None and responses is not None:
            columns = {**(columns or {}), **episode_columns(responses, self.tokenizer)}
        scored = self.rewards(
            samples,
            prompt_texts,
            response_texts,
            step=step,
            columns=columns,
            completion_ids=completion_ids,
            branch_scores=branch_scores,
            prompt_messages=messages,
            row_names=row_names,
            context=self.reward_context,
        )
        scores, environment_stats = scored.total, {}
        if self.agent is not None and responses is not None:  # an environment's own get_reward(), weight 1 (TRL's rule)
            own, environment_stats = environment_scores(self.agent, responses, step)
            scores = scores if own is None else scores + own.to(scores)
        if torch.isinf(scores).any():  # (NaN: no source scored the sample, TRL's None)
            raise TrainingError(f"the reward sources returned non-finite scores: {scores.tolist()}")
        # an ensemble branch's heads and their spread, beside the objective's score (reward_branch)
        parts = {**scored.parts, **ensemble_parts(branch_scores)}
        return Scored(total=scores, parts=parts, environment_stats=environment_stats)

    # ------------------------------------------------------------------ 3. shape
    def gather_batch(self, rollout: Rollout, scored: Scored) -> WholeBatch:
        """The WHOLE batch (every process's rows, gathered, the same on every process): what
        shapes the loss is computed over it, and each process keeps its own rows of the result."""
        gather, evaluation, responses = self.harness.dist.gather_rows, rollout.evaluation, rollout.responses
        degenerate = degeneration_flags(responses.response_ids, responses.ended)
        return WholeBatch(
            mask=gather(rollout.action_mask),
            logprobs=gather(evaluation.logprobs),
            ref_logprobs=gather(evaluation.ref_logprobs),
            values=gather(evaluation.values),
            entropy=gather(evaluation.entropy),
            raw_scores=gather(scored.total),
            ended=gather(torch.tensor(responses.ended, dtype=torch.float32)).bool(),
            degenerate=gather(torch.tensor(degenerate, dtype=torch.float32)),
            prompt_lengths=gather(torch.tensor([float(len(p)) for p in responses.prompt_ids])),
            parts={name: gather(part) for name, part in scored.parts.items()},
        )

    def shape(self, batch: WholeBatch, plan: StepPlan) -> Shaped:
        """Scores -> per-token rewards -> advantages (and returns) of the whole batch, and the
        loss mask: normalisation, DAPO's overlong penalty, the KL penalty, the estimator."""
        ppo, reward = self.config.ppo, self.config.reward
        mask, ended = batch.mask, batch.ended
        scores = normalize_scores(
            batch.raw_scores,
            reward.score_normalization,
            moments=self.score_moments,
            ref_mean=reward.score_ref_mean,
            ref_std=reward.score_ref_std,
        )
        # DAPO's soft overlong penalty (0 with reward.overlong_buffer 0): the accuracy logged stays the raw score's.
        max_new_tokens = self.config.generation.max_new_tokens
        length_penalty = overlong_penalty(mask.sum(-1), max_new_tokens, reward.overlong_buffer, reward.overlong_penalty)
        scores = scores + length_penalty.to(scores)
        rewards, reward_stats = shape_rewards(
            scores.to(self.device),
            batch.logprobs,
            batch.ref_logprobs,
            mask,
            plan.kl_coef,
            kl_estimator=plan.kl_estimator,
            kl_in_reward=plan.kl_in_reward,
            cliprange_reward=reward.cliprange_reward,
            ended_with_eos=ended.to(self.device),
            missing_eos_penalty=reward.missing_eos_penalty,
            group_baseline=plan.group_baseline,
        )
        advantages, returns = estimate_advantages(
            ppo.advantage_estimator,
            rewards,
            batch.values,
            mask,
            group_size=plan.group_size,
            gamma=ppo.gamma,
            lam=ppo.lam,
            whiten_advantages=ppo.whiten_advantages,
        )
        return Shaped(
            scores=scores,
            length_penalty=length_penalty,
            rewards=rewards,
            reward_stats=reward_stats,
            advantages=advantages,
            returns=returns,
            # DAPO's overlong filtering: truncated responses add nothing to the loss; nor does a sample no reward scored.
            loss_mask=(overlong_filter(mask, ended) if plan.mask_truncated else mask)
            * (~batch.unscored).to(mask)[:, None],
        )

    def experience_rows(self, rollout: Rollout, shaped: Shaped) -> Experience:
        """This process's rows of the shaped batch, with its own sequences and pass outputs."""
        evaluation, count, width = rollout.evaluation, len(rollout.indices), rollout.action_mask.shape[1]
        first_row = self.harness.dist.rank * count
        rows = slice(first_row, first_row + count)

        def mine(tensor):
            return tensor[rows, :width] if tensor is not None else None

        return Experience(
            input_ids=rollout.input_ids.to(self.device),
            attention_mask=rollout.attention_mask.to(self.device),
            action_mask=mine(shaped.loss_mask),
            split_hidden=evaluation.split_hidden,
            logprobs=evaluation.logprobs,
            ref_logprobs=evaluation.ref_logprobs,
            values=evaluation.values,
            rewards=mine(shaped.rewards),
            advantages=mine(shaped.advantages),
            returns=mine(shaped.returns),
            prompt_width=rollout.prompt_width,
            batch_weights=aggregation_weights(shaped.loss_mask, self.config.ppo.loss_agg_mode).cpu(),
            first_row=first_row,
        )

    def rollout_statistics(self, batch: WholeBatch, shaped: Shaped, plan: StepPlan) -> dict:
        """env/*, objective/*, tokens/* and ppo/advantages statistics of the whole batch."""
        mask, raw = batch.mask, batch.raw_scores
        stats = {
            "env/reward_mean": raw[~batch.unscored].mean().item() if not batch.unscored.all() else 0.0,
            "env/unscored_frac": batch.unscored.float().mean().item(),  # TRL's None: no reward scored it
            "env/reward_std": raw.std().item() if len(raw) > 1 else 0.0,
            # each source's unweighted mean (env/reward/<function name> | reward_model | reward_branch)
            **{f"env/reward/{name}": part.nanmean().item() for name, part in batch.parts.items()},
            "env/score_used_mean": shaped.scores.mean().item(),
            "env/missing_eos_frac": 1.0 - batch.ended.float().mean().item(),
            "env/degenerate_frac": batch.degenerate.mean().item(),  # a looping tail (algo/degeneration.py)
            "env/overlong_penalty_mean": shaped.length_penalty.mean().item(),
            **group_statistics(raw, plan.group_size),
            "objective/kl_coef": plan.kl_coef,
            "objective/entropy": masked_mean(batch.entropy, mask).item(),
            "tokens/responses_len_mean": mask.sum(-1).mean().item(),
            "tokens/prompts_len_mean": batch.prompt_lengths.mean().item(),
            "ppo/advantages/mean": masked_mean(shaped.advantages, mask).item(),
        }
        if plan.reference:
            # KL of the sampled sequences, summed over tokens (k1), as the adaptive controller expects.
            stats["objective/kl"] = masked_sum(batch.logprobs - batch.ref_logprobs, mask, dim=-1).mean().item()
            stats.update({f"objective/{key}": as_float(value) for key, value in shaped.reward_stats.items()})
        if plan.critic:
            stats["ppo/returns/mean"] = masked_mean(shaped.returns, mask).item()
        return stats

    # ------------------------------------------------------------------ 4. update
    def ppo_update(self, experience: Experience, plan: StepPlan) -> dict:
        """ppo_epochs passes of minibatches (experience.minibatch_plan) over the batch. Each
        micro-batch's loss is its share of its whole minibatch's (divided by the minibatch's
        token or row count, over every process), so the accumulated gradients, summed over the
        processes, are those of the minibatch's loss however it was split."""
        ppo, harness, dist = self.config.ppo, self.harness, self.harness.dist
        start = time.perf_counter()
        meter, updates = UpdateMeter(), 0
        # The critic warms up: only the value head's parameters step, the policy does not move.
        stepping = list(self.hydra.value_head.parameters()) if plan.critic_only else None
        for _ in range(ppo.ppo_epochs):
            minibatch_rows = minibatch_plan(experience.whole_batch_size, ppo.mini_batch_size, self.shuffle_generator)
            for minibatch, denominator in experience.minibatches(minibatch_rows):
                with dist.phase("updating the policy"):
                    loss_is_finite = self.accumulate_gradients(minibatch, plan, denominator, meter)
                grad_norm = harness.optimizer_step(loss_is_finite, only=stepping)
                if grad_norm is not None:
                    meter.grad_norms.append(grad_norm)
                    updates += 1
        minibatches = ppo.ppo_epochs * (experience.whole_batch_size // ppo.mini_batch_size)
        return {
            **meter.means(dist, minibatches, "ppo/"),
            "ppo/updates": updates,
            "ppo/critic_warmup": float(plan.critic_only),
            "ppo/nonfinite_skipped_total": harness.nonfinite_total,
            **harness.optimizer_stats("ppo/"),
            "time/update": time.perf_counter() - start,
        }

    def accumulate_gradients(self, minibatch: Experience, plan: StepPlan, denominator: float, meter) -> bool:
        """The minibatch's gradients, accumulated over its micro-batches (ppo.gradient_accumulation_steps);
        False at a non-finite loss. Out of memory with train.oom_backoff left, the micro-batches are halved
        and the minibatch starts again, its partial gradients dropped (train/memory.py)."""
        while True:
            ppo, taken = self.config.ppo, meter.mark()
            micro_rows = len(minibatch) // ppo.gradient_accumulation_steps
            try:
                with memory_phase(
                    "the update",
                    mini_batch_size=ppo.mini_batch_size,
                    micro_batch_rows=micro_rows,
                    tokens=minibatch.input_ids.shape[1],
                ):
                    for micro in minibatch.split(ppo.gradient_accumulation_steps):
                        loss, stats = self.minibatch_loss(micro, plan, denominator)
                        if not torch.isfinite(loss):
                            return False
                        self.harness.backward(loss)
                        meter.add(stats, float(micro.action_mask.sum()))
                return True
            except OutOfMemory as error:
                error.at_step(self.harness.step + 1)
                if self.backoff.shrink(error, self.config, self.harness.dist.world_size) is None:
                    raise
                self.harness.drop_gradients()
                meter.rewind(taken)

    def minibatch_loss(
        self, batch: Experience, plan: StepPlan, denominator: float | None = None
    ) -> tuple[torch.Tensor, dict]:
        """The clipped PPO loss of a (micro-)batch, running only the top layers on its cached split;
        with `denominator`, its share of a minibatch of that count (see algo.losses.aggregate)."""
        with self.harness.autocast():
            out = self.hydra.forward_top(
                batch.split_hidden,
                batch.input_ids,
                batch.attention_mask,
                return_entropy=plan.entropy_bonus,
                temperature=self.config.generation.temperature,
                logprobs_from=batch.prompt_width - 1,
                shared_prompt_width=batch.prompt_width if self.config.ppo.share_prompts else None,
            )
        new = response_part(out, batch.prompt_width)
        policy = PolicyTokens(logprobs=new.logprobs, values=new.values, entropy=new.entropy)
        loss, stats = ppo_loss(policy, batch.sampled_tokens(), plan.loss, loss_denominator=denominator)
        if plan.critic:
            parts = explained_variance_parts(new.values.detach(), batch.returns, batch.action_mask).tolist()
            stats.update(zip(EXPLAINED_VARIANCE_PARTS, parts))
        return loss, stats
