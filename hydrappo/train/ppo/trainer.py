"""PPOTrainer: the loop that turns prompts into a trained policy.

Its step, one PPO iteration top to bottom, is train/ppo/step.py's (PPOStep); this file builds
what the step reads (the hydra and its branches, the prompts, the reward sources, the sampler,
the optimizer, the KL controller), hands it to the step's constructor, and holds the rest of a
run: held-out evaluation (`evaluate`, TRL's name), the state a checkpoint keeps and exact resume.
Seeding, precision, the optimizer, logs, the non-finite policy, checkpoints and resume are the
harness's (train/harness.py).
"""

from __future__ import annotations

import copy
import functools
import logging
from pathlib import Path

import torch

from ...agent.rollouts import build_agent
from ...algo.kl import KLSteering, build_kl_controller
from ...config import Config, Problems
from ...errors import UsageError
from ...config.train_checks import check_process_shares
from ...config.task import has_held_out
from ...data import PromptSampler, tokenize_prompts
from ...generation.responses import Responses
from ...generation.samplers import build_sampler
from ...model import HydraModel
from ...rewards import RewardContext, build_reward_source
from ...storage.checkpoint import CheckpointError, rng_state, set_rng_state
from ...storage.reward_branch import apply_reference_stats, load_reward_branch
from ..api import save_model
from ..harness import TrainingLoop, enable_activation_checkpointing, prepare
from ...evaluation.heldout import HeldOutEvaluation, evaluation_due, held_out_summary
from ..inputs import RLInputs
from ..memory import BackOff, OutOfMemory, memory_phase
from ...data import pack_sequences
from .step import PPOStep


logger = logging.getLogger("hydrappo")
NO_HELD_OUT = (
    "trainer.evaluate() answers the held-out prompts, and this trainer has none: pass eval_dataset=... to the "
    "trainer (or set data.eval_prompts in the config)."
)


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

    def __init__(
        self,
        config: Config | None = None,
        *,
        hydra: HydraModel | None = None,
        tokenizer=None,
        config_dir=None,
        inputs: RLInputs | None = None,
        **objects,
    ):
        self.inputs = prepare(
            self, Config, config, objects, hydra=hydra, tokenizer=tokenizer, config_dir=config_dir, inputs=inputs
        )
        config, hydra, tokenizer = self.config, self.hydra, self.tokenizer
        ppo, train = config.ppo, config.train
        if not ppo.uses_critic:
            hydra.value_head = None  # critic-free: no value head in the optimizer or the checkpoints
        if config.model.gradient_checkpointing:
            enable_activation_checkpointing(hydra.model)
        if config.model.reward_branch_path:
            branch = load_reward_branch(hydra, config.model.reward_branch_path)
            hydra.attach_reward_branch(branch)
            if (
                config.reward.use_reward_branch
                and branch.head.heads == 1
                and config.reward.ensemble_objective != "mean"
            ):
                logger.warning(
                    "reward.ensemble_objective: %s has one head to choose from: the branch at %s was trained with "
                    "train.reward_heads 1, so it scores as it is. Train it with train.reward_heads > 1 for an "
                    "ensemble (examples/preference/README.md).",
                    config.reward.ensemble_objective,
                    config.model.reward_branch_path,
                )
            if config.model.value_head_init == "reward_head":  # a resumed run then loads its own value head
                hydra.value_head.init_from_reward_head(branch.head)
            # score_normalization 'ref' without explicit statistics: the reward checkpoint's.
            apply_reference_stats(config.reward, branch)

        rewards = build_reward_source(
            config.reward,
            device=str(self.device),
            functions=self.inputs.functions,
            shared_weight_sources=self.inputs.shared_sources,
        )
        data = config.data
        task = self.inputs.task
        held_out_prompts = None
        if task is not None:  # formatted as every reader of a task formats it: plain text for a base model, never cut
            prompts = task.prompt_set("train", tokenizer, data)
            held_out_prompts = task.prompt_set("eval", tokenizer, data) if has_held_out(config) else None
            self.inputs.prompts = [row["prompt"] for row in task.rows("train")]  # the rows as formatted: plain text
            self.inputs.eval_prompts = [row["prompt"] for row in task.rows("eval")]  # for a base model
        else:
            chat, system_prompt = data.apply_chat_template, data.system_prompt
            prompts = tokenize_prompts(self.inputs.prompts, tokenizer, data.max_prompt_length, chat, system_prompt)
            if self.inputs.eval_prompts:  # data.eval_prompts
                held_out_prompts = tokenize_prompts(
                    self.inputs.eval_prompts, tokenizer, data.max_prompt_length, chat, system_prompt
                )
        self.eval_columns = self.inputs.eval_columns
        # Multi-turn episodes with tools / environments (agent:, or tools= / environment_factory= objects).
        self.agent = build_agent(config, tokenizer, self.inputs.agent_code)
        self.backoff = BackOff(train.oom_backoff)  # train/memory.py
        self.held_out = None
        if held_out_prompts:  # data.eval_prompts, or a task's held-out items
            self.held_out = HeldOutEvaluation(
                held_out_prompts,
                tokenizer,
                batch_size=config.generation.generation_batch_size,
                greedy=train.eval_greedy,
                seed=train.seed,
                samples_per_prompt=train.eval_samples_per_prompt,
                # A task's verifiers give partial credit: eval/solved/<task> counts the answers scoring 1.
                solved_parts=tuple(task.names) if task is not None else (),
            )
        self._check_process_count()

        updates_per_step = ppo.ppo_epochs * (ppo.batch_size // ppo.mini_batch_size)
        self.harness.setup_optimizer(hydra.trainable_parameters(), ppo, train.total_steps * updates_per_step)
        # generation.sampler, built once: rollouts (in lockstep under a sharded trunk) and held-out answers.
        # Sampling runs the frozen bottom over every token; keep its outputs for the experience pass
        # (a sharded trunk generates in lockstep with padding steps, so it runs the pass again).
        rollout_sampler = build_sampler(config.generation, hydra, tokenizer, synced=self.harness.trunk_sharded)
        # One sampler for both unless the rollouts run in lockstep: a serving engine holds a copy of the model.
        self.eval_sampler = rollout_sampler
        if self.harness.trunk_sharded:
            self.eval_sampler = build_sampler(config.generation, hydra, tokenizer)
        recordable = hydra.has_frozen_split and rollout_sampler.records_split and not self.harness.trunk_sharded
        self.ppo_step = PPOStep(
            hydra=hydra,
            tokenizer=tokenizer,
            config=config,
            harness=self.harness,
            prompts=prompts,
            prompt_rows=self.inputs.prompts,
            columns=self.inputs.columns,
            sampler=PromptSampler(len(prompts.input_ids), train.seed),
            rollout_sampler=rollout_sampler,
            records_split=config.generation.reuse_trunk_pass and recordable,
            rewards=rewards,
            reward_context=RewardContext(max_steps=train.total_steps),  # TRL's trainer_state, log_metric, log_extra
            agent=self.agent,
            kl_controller=build_kl_controller(ppo.kl_controller, ppo.init_kl_coef, self.kl_steering()),
            backoff=self.backoff,
        )

    def kl_steering(self) -> KLSteering:
        ppo = self.config.ppo
        return KLSteering(
            target=ppo.kl_target,
            horizon=ppo.kl_horizon,
            kp=ppo.kl_pi_kp,
            ki=ppo.kl_pi_ki,
            integral_min=ppo.kl_pi_integral_min,
        )

    def builds_value_head(self) -> bool:
        return self.config.ppo.uses_critic

    @property
    def trained_module(self) -> HydraModel:
        return self.hydra

    def _check_process_count(self) -> None:
        """config/train_checks.py's rule for the processes of a launch, with the process group joined."""
        k, problems = self.harness.dist.world_size, Problems()
        check_process_shares(self.config.ppo, self.config.generation.samples_per_prompt, k, problems, f"{k} processes")
        problems.raise_if_any()

    @property
    def total_steps(self) -> int:
        return self.config.train.total_steps

    def summary(self, history: list[dict]) -> str:
        last = history[-1]
        kl = f", KL {last['objective/kl']:.3f}" if "objective/kl" in last else ""
        return (
            f"done: step {last['step']}, reward {last['env/reward_mean']:.3f}{kl}{held_out_summary(history)}; "
            f"checkpoints, metrics.jsonl and TensorBoard logs in {self.config.train.output_dir}"
        )

    def train_step(self) -> tuple[dict, list[dict] | dict]:
        """One PPO iteration (PPOStep.run), then the held-out evaluation when one is due."""
        stats, samples = self.run_step_backing_off()
        step, train = self.harness.step + 1, self.config.train
        if self.held_out is not None and evaluation_due(step, train.eval_every, train.total_steps):
            eval_stats, eval_samples = self.evaluate(step, with_answers=True)
            return {**stats, **eval_stats}, {"samples": samples, "eval_samples": eval_samples}
        return stats, samples

    def run_step_backing_off(self) -> tuple[dict, list[dict]]:
        """PPOStep.run; out of memory before the update with train.oom_backoff left, the chunk is
        halved and the step starts again from the state it started from (train/memory.py)."""
        # The state to start again from, kept only while a back-off is left (a snapshot each step costs
        # the random states of every device and a copy of the step's own state).
        started = (rng_state(), copy.deepcopy(self.ppo_step.state_dict())) if self.backoff.left else None
        while True:
            try:
                stats, samples = self.ppo_step.run()
                break
            except OutOfMemory as error:
                error.at_step(self.harness.step + 1)
                if self.backoff.shrink(error, self.config, self.harness.dist.world_size) is None:
                    raise
                set_rng_state(started[0])
                self.ppo_step.load_state_dict(copy.deepcopy(started[1]))
                self.ppo_step.reward_context.take()  # what the interrupted step's reward calls logged
        if self.config.train.oom_backoff:
            stats["oom/backoffs_total"] = self.backoff.total
        return stats, samples

    def train(self, resume=None) -> list[dict]:
        """Run until train.total_steps; `resume` = a checkpoint path or True/'latest'."""
        return self.harness.run(self, self.config.train.total_steps, resume)

    def save_model(self, output_dir) -> Path:
        """The policy as a plain transformers model folder (train/api.py)."""
        return save_model(self.hydra, self.tokenizer, output_dir)

    # ------------------------------------------------------------------ held-out evaluation
    def before_training(self):
        """The held-out baseline at step 0, before any update (its answers under eval_samples)."""
        if self.held_out is None:
            return None
        stats, samples = self.evaluate(0, with_answers=True)
        return stats, {"eval_samples": samples}

    def evaluate(self, step: int | None = None, with_answers: bool = False):
        """The held-out evaluation (evaluation/heldout.py), also the one a Trainer user expects after `train()`
        (TRL's `trainer.evaluate()`): the policy as it is now answers `eval_dataset` / data.eval_prompts, scored by
        the run's rewards; the eval/* statistics (and the answers' rows, `with_answers`). Training is unchanged."""
        if self.held_out is None:
            raise UsageError(NO_HELD_OUT)
        step = self.harness.step if step is None else step
        self.hydra.eval()
        stats, samples = self.held_out.evaluate(
            step,
            self.harness.dist,
            self.generate_for_evaluation,
            functools.partial(self.score_responses, step=step),  # a reward's error names this step
            status=self.harness.log.bar.status if self.harness.log is not None else None,
            guard=functools.partial(memory_phase, "held-out evaluation"),
            retry=self.back_off_evaluation,
            take_metrics=functools.partial(self.ppo_step.reward_context.take, "eval/"),
        )
        return (stats, samples) if with_answers else stats

    def back_off_evaluation(self, error: Exception, step: int) -> bool:
        """Out of memory with train.oom_backoff left: the evaluation's batch is halved and it answers again."""
        if not isinstance(error, OutOfMemory):
            return False
        error.at_step(step)
        if self.backoff.shrink(error, self.config, self.harness.dist.world_size) is None:
            return False
        self.held_out.batch_size = self.config.generation.generation_batch_size
        self.ppo_step.reward_context.take("eval/")
        return True

    def generate_for_evaluation(self, prompt_ids: list[list[int]], greedy: bool, rows=None) -> Responses:
        with self.harness.autocast():
            if self.agent is not None:  # the held-out rows played as episodes
                sample, prompt_rows, step = self.eval_sampler.sample, self.inputs.eval_prompts, self.harness.step
                return self.agent.play(sample, prompt_rows, self.eval_columns, rows, step=step, greedy=greedy)
            return self.eval_sampler.sample(prompt_ids, self.config.generation, greedy=greedy)

    def score_responses(
        self, rows: list[int], prompt_texts: list[str], responses: Responses, step: int | None = None
    ) -> tuple[torch.Tensor, dict]:
        """Scores of responses to held-out prompts `rows` outside the experience pass, from the
        run's reward sources (with the held-out table's columns), and each source's own scores;
        a reward branch scores them in a hydra pass of their own."""
        step_runner, branch_scores = self.ppo_step, None
        if self.config.reward.use_reward_branch:
            ids, mask, _, width = pack_sequences(
                responses.prompt_ids, responses.response_ids, self.tokenizer.pad_token_id
            )
            ids, mask = ids.to(self.device), mask.to(self.device)
            branch_scores = step_runner.experience_pass(ids, mask, width, with_reference=False).scores
        texts = step_runner.texts_of(responses)
        columns = {name: [values[i] for i in rows] for name, values in self.eval_columns.items()}
        messages = self.held_out.prompts.messages
        scored = step_runner.score(
            prompt_texts,
            texts,
            branch_scores,
            columns,
            responses.response_ids,
            [messages[i] for i in rows] if messages else None,
            step=step,
            row_names=[f"data.eval_prompts row {i}" for i in rows],
            responses=responses,
        )
        several = len(scored.parts) > 1 or self.held_out.solved_parts  # one task's part: its eval/solved/<task>
        return scored.total, scored.parts if several else None

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        return {
            "advantage_estimator": self.config.ppo.advantage_estimator,
            **self.ppo_step.state_dict(),
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
        self.ppo_step.load_state_dict(state)
        # this run's steering (changed on --resume: a warning) steers on from here
        self.ppo_step.kl_controller.retune(self.kl_steering())

    def write_extra(self, folder) -> None:
        """LoRA runs also save the adapter in peft's own format, loadable with
        `PeftModel.from_pretrained(base_model, folder / "adapter")`."""
        if self.hydra.uses_lora:
            self.hydra.peft_model.save_pretrained(str(folder / "adapter"))
