"""PPOTrainer: the loop that turns prompts into a trained policy.

One PPO step (Ziegler et al. 2019; Ouyang et al. 2022), top to bottom in `train_step`:
    sample prompts -> generate (policy, KV cache) -> one forward_hydra pass (log-probs,
    reference log-probs, values, split hidden state, [reward-branch score]) -> scores ->
    shaped rewards -> GAE -> whitened advantages -> ppo_epochs x minibatches of
    forward_top on the CACHED split hidden state -> clipped losses -> optimizer step
    -> KL controller update.
Seeding, precision, the optimizer, logs, the non-finite policy, checkpoints and resume are
the harness's (train/harness.py).

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

import functools
import time
from pathlib import Path

import torch

from ..algo.advantages import ESTIMATORS, estimate_advantages
from ..algo.degeneration import degeneration_flags
from ..algo.kl import build_kl_controller
from ..algo.losses import aggregation_weights, ppo_loss
from ..algo.masked import explained_variance_parts, masked_mean, masked_sum
from ..algo.scores import (
    RunningMoments,
    fill_unscored,
    group_statistics,
    normalize_scores,
    overlong_filter,
    overlong_penalty,
    shape_rewards,
)
from ..config import Config, Problems
from ..config.checks import check_process_shares
from ..data import PromptSampler, tokenize_prompts
from ..generation.responses import Responses
from ..generation.samplers import build_sampler
from ..model import HydraModel
from ..reward_calls import RewardContext, with_columns
from ..rewards import build_reward_source
from ..storage.checkpoint import CheckpointError
from ..storage.reward_branch import apply_reference_stats, load_reward_branch
from .api import save_model
from .experience import Experience, minibatch_plan
from .harness import TrainingError, TrainingLoop, as_float, enable_activation_checkpointing, prepare
from .heldout import HeldOutEvaluation, evaluation_due, held_out_summary
from .inputs import RLInputs
from .sequences import Rollout, evaluate_sequences, pack_sequences, pack_split_hidden, response_part
from .step_plan import StepPlan
from .update_meter import EXPLAINED_VARIANCE_PARTS, UpdateMeter


class PPOTrainer(TrainingLoop):
    """PPO-RLHF on one HydraModel.

    Build it from a `Config` (`hydrappo train` does), or from objects as TRL's trainers take
    them (train/api.py): `model` (id, path or a loaded PreTrainedModel), `reward_funcs`
    (callables or 'module:function' specs) and `reward_weights`, `train_dataset` /
    `eval_dataset` (a datasets.Dataset, a list of row dicts or a path), `args` (a Config, a
    YAML path or a dict shaped like the YAML file) and `processing_class` (the tokenizer).
    Pass `hydra`/`tokenizer` to use a hydra you built yourself. `config_dir` anchors
    relative paths of the config file.
    """

    name = "PPO"
    progress = {"reward": "env/reward_mean", "kl": "objective/kl", "eval": "eval/reward_mean"}

    def __init__(self, config: Config | None = None, *, hydra: HydraModel | None = None, tokenizer=None, config_dir=None,
                 inputs: RLInputs | None = None, **objects):  # fmt: skip
        self.inputs = prepare(self, Config, config, objects, hydra=hydra, tokenizer=tokenizer, config_dir=config_dir,
                              inputs=inputs)  # fmt: skip
        config, hydra, tokenizer = self.config, self.hydra, self.tokenizer
        ppo, train = config.ppo, config.train
        if not ppo.uses_critic:
            hydra.value_head = None  # critic-free: no value head in the optimizer or the checkpoints
        if config.model.gradient_checkpointing:
            enable_activation_checkpointing(hydra.model)
        if config.model.reward_branch_path:
            branch = load_reward_branch(hydra, config.model.reward_branch_path)
            hydra.attach_reward_branch(branch)
            if config.model.value_head_init == "reward_head":  # a resumed run then loads its own value head
                hydra.value_head.init_from_reward_head(branch.head)
            # score_normalization 'ref' without explicit statistics: the reward checkpoint's.
            apply_reference_stats(config.reward, branch)

        self.reward_source = build_reward_source(config.reward, device=str(self.device), functions=self.inputs.functions)
        self.reward_context = RewardContext(max_steps=train.total_steps)  # TRL's trainer_state, log_metric, log_extra
        data = config.data
        self.columns, self.eval_columns = self.inputs.columns, self.inputs.eval_columns
        self.prompts = tokenize_prompts(self.inputs.prompts, tokenizer, data.max_prompt_length, data.apply_chat_template,
                                        data.system_prompt)  # fmt: skip
        self.sampler = PromptSampler(len(self.prompts.input_ids), train.seed)
        self.held_out = None
        if data.eval_prompts:
            self.held_out = HeldOutEvaluation(
                tokenize_prompts(self.inputs.eval_prompts, tokenizer, data.max_prompt_length, data.apply_chat_template,
                                 data.system_prompt),
                tokenizer, batch_size=config.generation.generation_batch_size, greedy=train.eval_greedy, seed=train.seed,
            )
        self._check_process_count()

        updates_per_step = ppo.ppo_epochs * (ppo.batch_size // ppo.mini_batch_size)
        self.harness.setup_optimizer(hydra.trainable_parameters(), ppo, train.total_steps * updates_per_step)
        self.kl_controller = build_kl_controller(
            ppo.kl_controller, ppo.init_kl_coef, ppo.kl_target, ppo.kl_horizon, kp=ppo.kl_pi_kp, ki=ppo.kl_pi_ki
        )
        self.score_moments = RunningMoments()
        self.shuffle_generator = torch.Generator().manual_seed(train.seed)
        # generation.sampler, built once: rollouts (in lockstep under a sharded trunk) and held-out answers.
        # Sampling runs the frozen bottom over every token; keep its outputs for the experience pass
        # (a sharded trunk generates in lockstep with padding steps, so it runs the pass again).
        self.rollout_sampler = build_sampler(config.generation, hydra, tokenizer, synced=self.harness.trunk_sharded)
        # One sampler for both unless the rollouts run in lockstep: a serving engine holds a copy of the model.
        self.eval_sampler = self.rollout_sampler
        if self.harness.trunk_sharded:
            self.eval_sampler = build_sampler(config.generation, hydra, tokenizer)
        recordable = hydra.has_frozen_split and self.rollout_sampler.records_split and not self.harness.trunk_sharded
        self.records_split = config.generation.reuse_trunk_pass and recordable

    def builds_value_head(self) -> bool:
        return self.config.ppo.uses_critic

    @property
    def trained_module(self) -> HydraModel:
        return self.hydra

    def _check_process_count(self) -> None:
        """config/checks.py's rule for the processes of a launch, with the process group joined."""
        k, problems = self.harness.dist.world_size, Problems()
        check_process_shares(self.config.ppo, self.config.generation.samples_per_prompt, k, problems, f"{k} processes")
        problems.raise_if_any()

    @property
    def total_steps(self) -> int:
        return self.config.train.total_steps

    def summary(self, history: list[dict]) -> str:
        last = history[-1]
        kl = f", KL {last['objective/kl']:.3f}" if "objective/kl" in last else ""
        return (f"done: step {last['step']}, reward {last['env/reward_mean']:.3f}{kl}{held_out_summary(history)}; "
                f"checkpoints, metrics.jsonl and TensorBoard logs in {self.config.train.output_dir}")  # fmt: skip

    def train(self, resume=None) -> list[dict]:
        """Run until train.total_steps; `resume` = a checkpoint path or True/'latest'."""
        return self.harness.run(self, self.config.train.total_steps, resume)

    def save_model(self, output_dir) -> Path:
        """The policy as a plain transformers model folder (train/api.py)."""
        return save_model(self.hydra, self.tokenizer, output_dir)

    # ------------------------------------------------------------------ the step
    def train_step(self) -> tuple[dict, list[dict]]:
        plan = self.step_plan()
        # Dropout is off either way; the mode matters because transformers checkpoints layers
        # only in train mode, and turns the KV cache off there: generate in eval mode.
        self.hydra.eval()
        experience, stats, samples = self.make_experience(plan)
        metrics, extras = self.reward_context.take()  # what the reward functions logged (TRL's log_metric, log_extra)
        stats.update(metrics)
        samples = with_columns(samples, extras)
        self.hydra.train(self.config.model.gradient_checkpointing)
        stats.update(self.ppo_update(experience, plan))
        self.hydra.eval()
        if stats["ppo/updates"] and not plan.critic_only:  # the warm-up updates the value head alone
            self.rollout_sampler.weights_changed()
        if plan.reference:  # the KL was measured
            self.kl_controller.update(stats["objective/kl"], self.config.ppo.batch_size)
        step, train = self.harness.step + 1, self.config.train
        if self.held_out is not None and evaluation_due(step, train.eval_every, train.total_steps):
            eval_stats, eval_samples = self.evaluate_held_out(step)
            return {**stats, **eval_stats}, {"samples": samples, "eval_samples": eval_samples}
        return stats, samples

    def step_plan(self) -> StepPlan:
        """What the next step runs (train/step_plan.py), at the KL coefficient the controller holds now."""
        return StepPlan.for_step(self.config.ppo, self.kl_controller.value, self.harness.step)

    def before_training(self):
        """The held-out baseline at step 0, before any update."""
        return self.evaluate_held_out(0) if self.held_out is not None else None

    def evaluate_held_out(self, step: int) -> tuple[dict, list[dict]]:
        """eval/* statistics and rows of the policy's answers to the held-out prompts (train/heldout.py)."""
        start = time.perf_counter()
        self.hydra.eval()
        status = self.harness.log.bar.status if self.harness.log is not None else (lambda text: None)
        status(f"step {step}: evaluating {len(self.held_out.prompts)} held-out prompts")  # on the bar and in the log
        try:
            score = functools.partial(self.score_responses, step=step)  # a reward's error names this step
            stats, samples = self.held_out.run(step, self.harness.dist, self.generate_for_evaluation, score)
        finally:
            status(None)
        metrics, extras = self.reward_context.take("eval/")
        return {**stats, **metrics, "time/eval": time.perf_counter() - start}, with_columns(samples, extras)

    def generate_for_evaluation(self, prompt_ids: list[list[int]], greedy: bool) -> Responses:
        with self.harness.autocast():
            return self.eval_sampler.sample(prompt_ids, self.config.generation, greedy=greedy)

    def score_responses(self, rows: list[int], prompt_texts: list[str], responses: Responses,
                        step: int | None = None) -> tuple[torch.Tensor, dict]:  # fmt: skip
        """Scores of responses to held-out prompts `rows` outside the experience pass, from the
        run's reward sources (with the held-out table's columns), and each source's own scores;
        a reward branch scores them in a hydra pass of their own."""
        branch_scores = None
        if self.config.reward.use_reward_branch:
            ids, mask, _, width = pack_sequences(responses.prompt_ids, responses.response_ids, self.tokenizer.pad_token_id)
            branch_scores = self.evaluate(ids.to(self.device), mask.to(self.device), width, with_reference=False).scores
        texts = self.tokenizer.batch_decode(responses.response_ids, skip_special_tokens=True)
        columns = {name: [values[i] for i in rows] for name, values in self.eval_columns.items()}
        messages = self.held_out.prompts.messages
        scores = self.score(prompt_texts, texts, branch_scores, columns, responses.response_ids,
                            [messages[i] for i in rows] if messages else None, step=step,
                            row_names=[f"data.eval_prompts row {i}" for i in rows])  # fmt: skip
        return scores, dict(self.reward_source.last) if len(self.reward_source.entries) > 1 else None

    @torch.no_grad()
    def make_experience(self, plan: StepPlan) -> tuple[Experience, dict, list[dict]]:
        """Sample, score, shape and estimate one PPO batch: (this process's rows, stats, samples)."""
        start = time.perf_counter()
        rollout = self.rollout(plan)
        with self.harness.dist.phase("scoring responses"):
            raw_scores = self.score_rollout(rollout)
        batch = self.gather_batch(rollout, raw_scores)
        batch["raw_scores"], batch["unscored"] = fill_unscored(batch["raw_scores"], self.config.generation.samples_per_prompt)
        shaped = self.shape(batch, plan)
        experience = self.experience_rows(rollout, shaped)
        stats = {**self.rollout_statistics(batch, shaped, plan), "time/rollout": time.perf_counter() - start}
        texts = zip(rollout.prompt_texts, rollout.response_texts, raw_scores)
        return experience, stats, [{"prompt": p, "response": r, "score": float(s)} for p, r, s in texts]  # (NaN: unscored)

    def rollout(self, plan: StepPlan) -> Rollout:
        """This process's share of the batch's prompts, each sampled G times (one group in
        consecutive rows), packed and passed through the hydra once (log-probs, reference,
        values, the reward branch)."""
        ppo, dist, group = self.config.ppo, self.harness.dist, self.config.generation.samples_per_prompt
        # With a sharded trunk generation and evaluation hold collectives (FSDP's gathers), which a
        # phase must not: a failure there ends the others through the process group instead.
        with dist.phase("generating responses", enabled=not self.harness.trunk_sharded):
            # Every process draws the same prompts and keeps its share of them: the order of the
            # prompts does not depend on the number of processes.
            indices = [i for i in dist.shard(self.sampler.next_batch(ppo.batch_size // group)) for _ in range(group)]
            responses = self.generate([self.prompts.input_ids[i] for i in indices])
            input_ids, attention_mask, action_mask, prompt_width = pack_sequences(
                responses.prompt_ids, responses.response_ids, self.tokenizer.pad_token_id
            )
            split = pack_split_hidden(responses, prompt_width, input_ids.shape[1])  # recorded while sampling, or None
            responses.split_hidden = None  # the per-row copies: packed now
            evaluation = self.evaluate(input_ids, attention_mask, prompt_width, with_reference=plan.reference, split_hidden=split)
        return Rollout(
            indices=indices, prompt_texts=[self.prompts.texts[i] for i in indices], responses=responses,
            response_texts=self.tokenizer.batch_decode(responses.response_ids, skip_special_tokens=True),
            input_ids=input_ids, attention_mask=attention_mask, action_mask=action_mask.to(self.device),
            prompt_width=prompt_width, evaluation=evaluation,
        )  # fmt: skip

    def score_rollout(self, rollout: Rollout) -> torch.Tensor:
        """The reward sources' weighted sum for this process's rows, with their dataset columns."""
        columns = {name: [values[i] for i in rollout.indices] for name, values in self.columns.items()}
        messages = [self.prompts.messages[i] for i in rollout.indices] if self.prompts.messages else None
        return self.score(rollout.prompt_texts, rollout.response_texts, rollout.evaluation.scores, columns,
                          rollout.responses.response_ids, messages, row_names=[f"data.prompts row {i}" for i in rollout.indices])  # fmt: skip

    def gather_batch(self, rollout: Rollout, raw_scores: torch.Tensor) -> dict:
        """The WHOLE batch (every process's rows, gathered, the same on every process): what
        shapes the loss is computed over it, and each process keeps its own rows of the result."""
        gather, evaluation, responses = self.harness.dist.gather_rows, rollout.evaluation, rollout.responses
        return {
            "mask": gather(rollout.action_mask), "logprobs": gather(evaluation.logprobs),
            "ref_logprobs": gather(evaluation.ref_logprobs), "values": gather(evaluation.values),
            "entropy": gather(evaluation.entropy), "raw_scores": gather(raw_scores),
            "ended": gather(torch.tensor(responses.ended, dtype=torch.float32)).bool(),
            "degenerate": gather(torch.tensor(degeneration_flags(responses.response_ids, responses.ended), dtype=torch.float32)),
            "prompt_lengths": gather(torch.tensor([float(len(p)) for p in responses.prompt_ids])),
            "parts": {name: gather(part) for name, part in self.reward_source.last.items()},
        }  # fmt: skip

    def shape(self, batch: dict, plan: StepPlan) -> dict:
        """Scores -> per-token rewards -> advantages (and returns) of the whole batch, and the
        loss mask: normalisation, DAPO's overlong penalty, the KL penalty, the estimator."""
        ppo, reward_cfg, group = self.config.ppo, self.config.reward, self.config.generation.samples_per_prompt
        mask, ended = batch["mask"], batch["ended"]
        scores = normalize_scores(
            batch["raw_scores"], reward_cfg.score_normalization, moments=self.score_moments,
            ref_mean=reward_cfg.score_ref_mean, ref_std=reward_cfg.score_ref_std,
        )  # fmt: skip
        # DAPO's soft overlong penalty (0 with reward.overlong_buffer 0): the accuracy logged stays the raw score's.
        length_penalty = overlong_penalty(mask.sum(-1), self.config.generation.max_new_tokens,
                                          reward_cfg.overlong_buffer, reward_cfg.overlong_penalty)  # fmt: skip
        scores = scores + length_penalty.to(scores)
        rewards, reward_stats = shape_rewards(
            scores.to(self.device), batch["logprobs"], batch["ref_logprobs"], mask, plan.kl_coef,
            kl_estimator=ppo.kl_estimator, kl_in_reward=plan.kl_in_reward,
            cliprange_reward=reward_cfg.cliprange_reward, ended_with_eos=ended.to(self.device),
            missing_eos_penalty=reward_cfg.missing_eos_penalty,
            group_baseline=group if ESTIMATORS[ppo.advantage_estimator].baseline_on_scores else 0,
        )
        advantages, returns = estimate_advantages(
            ppo.advantage_estimator, rewards, batch["values"], mask, group_size=group, gamma=ppo.gamma,
            lam=ppo.lam, whiten_advantages=ppo.whiten_advantages,
        )
        # DAPO's overlong filtering: truncated responses add nothing to the loss.
        loss_mask = overlong_filter(mask, ended) if ppo.mask_truncated else mask
        loss_mask = loss_mask * (~batch["unscored"]).to(loss_mask)[:, None]  # a sample no reward scored: out of the loss
        return {"scores": scores, "length_penalty": length_penalty, "rewards": rewards, "reward_stats": reward_stats,
                "advantages": advantages, "returns": returns, "loss_mask": loss_mask}  # fmt: skip

    def experience_rows(self, rollout: Rollout, shaped: dict) -> Experience:
        """This process's rows of the shaped batch, with its own sequences and pass outputs."""
        evaluation, count, width = rollout.evaluation, len(rollout.indices), rollout.action_mask.shape[1]
        first_row = self.harness.dist.rank * count
        rows = slice(first_row, first_row + count)

        def mine(tensor):
            return tensor[rows, :width] if tensor is not None else None

        return Experience(
            input_ids=rollout.input_ids.to(self.device), attention_mask=rollout.attention_mask.to(self.device),
            action_mask=mine(shaped["loss_mask"]), split_hidden=evaluation.split_hidden, logprobs=evaluation.logprobs,
            ref_logprobs=evaluation.ref_logprobs, values=evaluation.values, rewards=mine(shaped["rewards"]),
            advantages=mine(shaped["advantages"]), returns=mine(shaped["returns"]), prompt_width=rollout.prompt_width,
            batch_weights=aggregation_weights(shaped["loss_mask"], self.config.ppo.loss_agg_mode).cpu(), first_row=first_row,
        )  # fmt: skip

    def rollout_statistics(self, batch: dict, shaped: dict, plan: StepPlan) -> dict:
        """env/*, objective/*, tokens/* and ppo/advantages statistics of the whole batch."""
        mask, raw = batch["mask"], batch["raw_scores"]
        stats = {
            "env/reward_mean": raw[~batch["unscored"]].mean().item() if not batch["unscored"].all() else 0.0,
            "env/unscored_frac": batch["unscored"].float().mean().item(),  # TRL's None: no reward scored it
            "env/reward_std": raw.std().item() if len(raw) > 1 else 0.0,
            # each source's unweighted mean (env/reward/<function name> | reward_model | reward_branch)
            **{f"env/reward/{name}": part.nanmean().item() for name, part in batch["parts"].items()},
            "env/score_used_mean": shaped["scores"].mean().item(),
            "env/missing_eos_frac": 1.0 - batch["ended"].float().mean().item(),
            "env/degenerate_frac": batch["degenerate"].mean().item(),  # a looping tail (algo/degeneration.py)
            "env/overlong_penalty_mean": shaped["length_penalty"].mean().item(),
            **group_statistics(raw, self.config.generation.samples_per_prompt),
            "objective/kl_coef": plan.kl_coef,
            "objective/entropy": masked_mean(batch["entropy"], mask).item(),
            "tokens/responses_len_mean": mask.sum(-1).mean().item(),
            "tokens/prompts_len_mean": batch["prompt_lengths"].mean().item(),
            "ppo/advantages/mean": masked_mean(shaped["advantages"], mask).item(),
        }
        if plan.reference:
            # KL of the sampled sequences, summed over tokens (k1), as the adaptive controller expects.
            stats["objective/kl"] = masked_sum(batch["logprobs"] - batch["ref_logprobs"], mask, dim=-1).mean().item()
            stats.update({f"objective/{key}": as_float(value) for key, value in shaped["reward_stats"].items()})
        if plan.critic:
            stats["ppo/returns/mean"] = masked_mean(shaped["returns"], mask).item()
        return stats

    def generate(self, prompt_ids: list[list[int]]) -> Responses:
        """One sampled response per prompt from the policy."""
        with self.harness.autocast():
            return self.rollout_sampler.sample(prompt_ids, self.config.generation, record_split=self.records_split)

    def evaluate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int, with_reference=True,
                 split_hidden=None):  # fmt: skip
        """Log-probs, reference log-probs, values, entropy, split hidden state [and reward-branch
        scores] of the packed rollouts, from one hydra pass per chunk (of the branches alone
        when sampling recorded the `split_hidden`)."""
        generation = self.config.generation
        return evaluate_sequences(
            self.hydra, input_ids, attention_mask, prompt_width, temperature=generation.temperature,
            chunk_size=generation.generation_batch_size, autocast=self.harness.autocast, with_reference=with_reference,
            split_hidden=split_hidden,
        )

    def score(self, prompt_texts: list[str], response_texts: list[str], branch_scores, columns=None,
              completion_ids=None, messages=None, step=None, row_names=None) -> torch.Tensor:  # fmt: skip
        """The weighted sum of every reward source's scores of this process's rows (rewards.RewardSources);
        `messages`: the rows' prompts as message lists, when the prompt column holds them (prompts.py).
        `step` (default: the step in progress) and `row_names` (each row's table and row) go into a failing source's error."""
        samples = [p + r for p, r in zip(prompt_texts, response_texts)]
        step = self.harness.step + 1 if step is None else step
        self.reward_context.trainer_state.global_step = self.harness.step  # TRL's: the steps done
        scores = self.reward_source(
            samples, prompt_texts, response_texts, step=step, columns=columns, completion_ids=completion_ids,
            branch_scores=branch_scores, prompt_messages=messages, row_names=row_names, context=self.reward_context,
        )
        if torch.isinf(scores).any():  # (NaN: no source scored the sample, TRL's None)
            raise TrainingError(f"the reward sources returned non-finite scores: {scores.tolist()}")
        return scores

    # ------------------------------------------------------------------ the update
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
                loss_is_finite = True
                with dist.phase("updating the policy"):
                    for micro in minibatch.split(ppo.gradient_accumulation_steps):
                        loss, stats = self.minibatch_loss(micro, plan, denominator)
                        if not torch.isfinite(loss):
                            loss_is_finite = False
                            break
                        harness.backward(loss)
                        meter.add(stats, float(micro.action_mask.sum()))
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

    def minibatch_loss(self, batch: Experience, plan: StepPlan,
                       denominator: float | None = None) -> tuple[torch.Tensor, dict]:  # fmt: skip
        """The clipped PPO loss of a (micro-)batch, running only the top layers on its cached split;
        with `denominator`, its share of a minibatch of that count (see algo.losses.aggregate)."""
        ppo = self.config.ppo
        with self.harness.autocast():
            out = self.hydra.forward_top(
                batch.split_hidden, batch.input_ids, batch.attention_mask, return_entropy=plan.entropy_bonus,
                temperature=self.config.generation.temperature, logprobs_from=batch.prompt_width - 1,
            )
        new = response_part(out, batch.prompt_width)
        loss, stats = ppo_loss(
            new.logprobs, batch.logprobs, batch.advantages, new.values, batch.values, batch.returns, batch.action_mask,
            cliprange=ppo.cliprange, cliprange_high=ppo.cliprange_high, cliprange_value=ppo.cliprange_value,
            vf_coef=ppo.vf_coef, ent_coef=ppo.ent_coef, entropy=new.entropy, dual_clip=ppo.dual_clip,
            loss_agg_mode=ppo.loss_agg_mode, importance_sampling_level=ppo.importance_sampling_level,
            ref_logprobs=batch.ref_logprobs, kl_coef=plan.loss_kl_coef, loss_denominator=denominator,
        )
        if plan.critic:
            parts = explained_variance_parts(new.values.detach(), batch.returns, batch.action_mask).tolist()
            stats.update(zip(EXPLAINED_VARIANCE_PARTS, parts))
        return loss, stats

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
        ppo = self.config.ppo  # this run's KL settings (changed on --resume: a warning) steer on from here
        settings = {"target": ppo.kl_target, "horizon": ppo.kl_horizon, "kp": ppo.kl_pi_kp, "ki": ppo.kl_pi_ki}
        for name, value in settings.items():
            if hasattr(self.kl_controller, name):
                setattr(self.kl_controller, name, float(value))
        self.score_moments.load_state_dict(state["score_moments"])
        self.sampler.load_state_dict(state["sampler"])

    def write_extra(self, folder) -> None:
        """LoRA runs also save the adapter in peft's own format, loadable with
        `PeftModel.from_pretrained(base_model, folder / "adapter")`."""
        if self.hydra.uses_lora:
            self.hydra.peft_model.save_pretrained(str(folder / "adapter"))
