"""Reward model training on the hydra trunk: pairwise (Bradley-Terry) preferences.

    hydrappo reward CONFIG.yaml [--resume] [--option value ...]

The reward model is a *branch* of the same trunk PPO uses: a trainable copy of the
ORIGINAL top N decoder layers, its own copy of the final norm and a scalar head read
at the last non-padding token. The bottom L - N layers are frozen, so they run without
gradients (once per example with `train.cache_split_hidden`), and only the branch
trains. The chosen and the rejected response of a pair go through in one batch; the
loss is algo/losses.py's `preference_loss`.

After training, the branch's mean and std score on a reference set are stored with the
final checkpoint, so PPO can normalise scores to mean 0 / std 1 under the initial policy
(`reward.score_normalization: ref`; Ziegler et al. 2019, Huang et al. 2024). The
checkpoint format is storage/reward_branch.py's.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

import torch
import yaml

from ..algo.ensemble import bootstrap_counts
from ..algo.losses import preference_loss, response_nll
from ..algo.scores import score_statistics
from ..config import GenerationArgs, RewardConfig
from ..data import DataError, encode_prompts, tokenize_responses
from ..preferences import PreferencePairs, load_preference_pairs
from ..errors import UsageError
from ..generation.samplers import build_sampler
from ..model import HydraModel
from ..storage.checkpoint import latest_checkpoint
from ..storage.reward_branch import (
    REWARD_FORMAT_VERSION,
    REWARD_KIND,
    base_model_identity,
    load_reward_branch,
    save_reward_folder,
)
from .harness import TrainingError, prepare
from .inputs import StageInputs
from .run_log import as_float
from ..data import pack_sequences
from .stage import BestEvaluation, EpochBatches, SplitCache, SupervisedStage, batches, total_steps_of, weighted_means

logger = logging.getLogger("hydrappo")


class RewardTrainer(SupervisedStage):
    """Trains a reward branch on a frozen hydra trunk from preference pairs.

    Build it from a `RewardConfig` (`hydrappo reward` does), or from objects as PPOTrainer is
    (train/api.py: `model`, `train_dataset` / `eval_dataset` of pairs, `args`,
    `processing_class`); pass `hydra`/`tokenizer` to use a model you built yourself.
    `config_dir` anchors relative paths of the config."""

    name = "reward"
    progress = {"loss": "train/loss", "acc": "train/accuracy"}

    def __init__(
        self,
        config: RewardConfig | None = None,
        *,
        hydra: HydraModel | None = None,
        tokenizer=None,
        config_dir=None,
        inputs: StageInputs | None = None,
        **objects,
    ):
        inputs = prepare(
            self, RewardConfig, config, objects, hydra=hydra, tokenizer=tokenizer, config_dir=config_dir, inputs=inputs
        )
        config, hydra, tokenizer = self.config, self.hydra, self.tokenizer
        data, train = config.data, config.train
        if hydra.full_model:
            raise DataError("reward training needs a frozen trunk: set model.num_layers_unfrozen >= 0 (not -1).")
        # Nothing of the policy, reference or value head trains here; only the branch.
        hydra.requires_grad_(False)
        hydra.eval()
        if config.model.reward_branch_path:
            # Continue training an existing reward branch.
            self.branch = load_reward_branch(hydra, config.model.reward_branch_path).requires_grad_(True)
            for option, ours in (("pooling", self.branch.pooling), ("reward_heads", self.branch.head.heads)):
                if getattr(train, option) != ours:
                    raise UsageError(
                        f"train.{option}={getattr(train, option)} differs from the branch being continued "
                        f"({config.model.reward_branch_path}: {option}={ours}); set train.{option}: {ours}."
                    )
            heads = self.branch.head.heads
            self.branch.head.standardise(torch.zeros(heads), torch.ones(heads))  # raw scores until it ends again
        else:
            self.branch = hydra.new_reward_branch(trainable=True, own_norm=True, heads=train.reward_heads)
            self.branch.pooling = train.pooling

        # The tables were read and checked before the model loaded (train/inputs.py).
        pairs = load_preference_pairs(data.train_file, tokenizer, data, table=inputs.train)
        self.train_pairs = pairs.usable(inputs.train_rows)
        if inputs.eval is not None:
            self.eval_pairs = load_preference_pairs(data.eval_file, tokenizer, data, table=inputs.eval).usable()
        else:
            self.eval_pairs = pairs.usable(inputs.eval_rows)
        self.stats_table = inputs.stats
        logger.info(
            "reward training: %d training pairs, %d held-out pairs", len(self.train_pairs), len(self.eval_pairs)
        )

        # How often each head sees each training pair: its bootstrap resample (algo/ensemble.py).
        heads = self.branch.head.heads
        self.counts = (
            bootstrap_counts(len(self.train_pairs), heads, train.seed) if heads > 1 and train.bootstrap else None
        )
        self.split_cache = SplitCache(hydra, train.cache_split_hidden)
        self.total_steps = total_steps_of(train, len(self.train_pairs))
        self.batches = EpochBatches(len(self.train_pairs), train.batch_size, train.seed)
        self.best = BestEvaluation.of(train, len(self.eval_pairs) > 0)  # train.load_best_model_at_end
        self.harness.setup_optimizer(self.branch.parameters(), train, self.total_steps)
        self.score_stats: dict | None = None
        self.final_eval: dict = {}
        self.last_stats: dict = {}
        self.checkpoint_path = None

    @property
    def trained_module(self):
        return self.branch

    def train(self, resume=None) -> list[dict]:
        """Train, evaluate, compute the reference statistics and write the final checkpoint."""
        history = super().train(resume)
        self.checkpoint_path = latest_checkpoint(self.harness.output_dir)
        return history

    def save_model(self, output_dir) -> Path:
        """The reward branch as a reward checkpoint folder (storage/reward_branch.py), with the
        reference score statistics once training ended: `model.reward_branch_path: output_dir`
        in a PPO config loads it, as it loads the run's own checkpoints."""
        info = {key: value for key, value in self.state_dict().items() if key != "batches"}
        config_yaml = yaml.safe_dump(self.config.to_dict(), sort_keys=False)
        return save_reward_folder(output_dir, self.branch, {**info, "step": self.step}, config_yaml)

    def summary(self, history: list[dict]) -> str:
        evaluation = ", ".join(
            f"{k} {v:.3f}" for k, v in self.final_eval.items() if k in ("eval/accuracy", "eval/loss")
        )
        stats = self.score_stats or {}
        return (
            f"done: step {self.step}{', ' + evaluation if evaluation else ''}; reference scores mean "
            f"{stats.get('score_mean', float('nan')):.4f}, std {stats.get('score_std', float('nan')):.4f}.\n"
            f"reward checkpoint: {self.checkpoint_path}\n"
            f"use it in PPO with model.reward_branch_path: {self.config.train.output_dir} and reward.use_reward_branch: "
            f"true ({self._split_option()})"
        )

    def _split_option(self) -> str:
        """The option that puts PPO's split where this branch starts."""
        band = self.config.model.trainable_layers
        if band is not None:
            return f"model.trainable_layers: '{band}', or any band starting at layer {self.hydra.split_index}"
        return f"model.num_layers_unfrozen: {self.hydra.num_layers_unfrozen}"

    def cache_examples(self) -> dict:
        examples = {}
        for tag, pairs in (("train", self.train_pairs), ("eval", self.eval_pairs)):
            for i in range(len(pairs)):
                examples[(tag, i, 0)] = (pairs.prompt_ids[i], pairs.chosen_ids[i])
                examples[(tag, i, 1)] = (pairs.prompt_ids[i], pairs.rejected_ids[i])
        return examples

    # ------------------------------------------------------------------ scoring
    def _scores(self, keys, prompt_ids, response_ids, nll_rows: int = 0):
        """The branch's scores of the packed rows; with `nll_rows=n`, also the mean NLL of the first n rows'
        response tokens under the LM head (GRM's regulariser, algo/losses.py response_nll)."""
        input_ids, attention_mask, action_mask, width = pack_sequences(
            prompt_ids, response_ids, self.tokenizer.pad_token_id
        )
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        split = self.split_cache(keys, input_ids, attention_mask)
        with self.harness.autocast():
            out = self.hydra.reward_scores(
                split, input_ids, attention_mask, self.branch, response_start=width, logprob_rows=nll_rows
            )
        if not nll_rows:
            return out
        scores, logprobs = out
        nll, _ = response_nll(logprobs[:, width - 1 :], action_mask[:nll_rows].to(logprobs.device))
        return scores, nll

    def _pair_scores(self, pairs: PreferencePairs, index: list[int], tag: str, with_nll: bool = False):
        """Chosen and rejected scores of pairs `index`, in ONE batch (2 x len(index) rows); `with_nll`: and the
        chosen answers' mean NLL under the LM head (else None)."""
        keys = [(tag, i, 0) for i in index] + [(tag, i, 1) for i in index]
        prompts = [pairs.prompt_ids[i] for i in index]
        responses = [pairs.chosen_ids[i] for i in index] + [pairs.rejected_ids[i] for i in index]
        out = self._scores(keys, prompts + prompts, responses, nll_rows=len(index) if with_nll else 0)
        scores, nll = out if with_nll else (out, None)
        return scores[: len(index)], scores[len(index) :], nll

    @torch.no_grad()
    def score(
        self, prompt_ids: list[list[int]], response_ids: list[list[int]], batch_size: int | None = None
    ) -> torch.Tensor:
        """Scores of (prompt, response) token sequences by the branch as it is now (B,), on the CPU."""
        batch_size = batch_size or self.config.train.eval_batch_size
        out = []
        for start in range(0, len(prompt_ids), batch_size):
            stop = start + batch_size
            out.append(self._scores(None, prompt_ids[start:stop], response_ids[start:stop]).cpu())
        return torch.cat(out) if out else torch.zeros(0)

    @torch.no_grad()
    def evaluate(self, pairs: PreferencePairs | None = None, tag: str = "eval") -> dict:
        """Loss, accuracy and mean margin over all of `pairs` (default: the held-out pairs); the
        batches are shared among the processes."""
        pairs = self.eval_pairs if pairs is None else pairs
        if not len(pairs):
            return {}

        def pair_scores(index):
            return tuple(x.cpu() for x in self._pair_scores(pairs, index, tag)[:2])

        index_batches = batches(len(pairs), max(1, self.config.train.eval_batch_size // 2))
        done = self.harness.dist.map_in_order(pair_scores, index_batches, f"evaluating on the {tag} pairs")
        chosen, rejected = [c for c, _ in done], [r for _, r in done]
        margins = torch.tensor(pairs.margins) if pairs.margins is not None else None
        _, stats = preference_loss(torch.cat(chosen), torch.cat(rejected), margins)
        return {f"{tag}/{key}": as_float(value) for key, value in stats.items()}

    @torch.no_grad()
    def reference_statistics(self) -> dict:
        """Mean and std of the trained branch's scores on the reference set (see data.stats_file),
        its batches shared among the processes."""
        data, train = self.config.data, self.config.train
        rng = random.Random(train.seed)
        what = "scoring the reference set"
        if data.stats_file is None:
            pairs = self.train_pairs
            candidates = [(i, side) for i in range(len(pairs)) for side in (0, 1)]
            chosen_set = sorted(rng.sample(candidates, min(data.stats_max_samples, len(candidates))))

            def part_scores(part):
                keys = [("train", i, side) for i, side in part]
                responses = [(pairs.chosen_ids if side == 0 else pairs.rejected_ids)[i] for i, side in part]
                return self._scores(keys, [pairs.prompt_ids[i] for i, _ in part], responses).cpu()

            parts = [
                chosen_set[start : start + train.eval_batch_size]
                for start in range(0, len(chosen_set), train.eval_batch_size)
            ]
            scores = self.harness.dist.map_in_order(part_scores, parts, what)
            source = f"chosen and rejected responses of {len(chosen_set)} training texts"
        else:
            prompt_column, table = data.prompt_column or "prompt", self.stats_table
            index = sorted(
                rng.sample(range(len(table[prompt_column])), min(data.stats_max_samples, len(table[prompt_column])))
            )
            prompt_ids = encode_prompts([table[prompt_column][i] for i in index], self.tokenizer, data)
            response_ids = None
            if table[data.stats_response_column] is not None:
                texts = [str(table[data.stats_response_column][i]) for i in index]
                response_ids = tokenize_responses(texts, self.tokenizer, data.max_response_length, data.append_eos)
                source = f"{len(index)} prompt/response rows of {data.stats_file}"
            else:
                # Responses of the base policy, sampled and stopped as PPO's first rollouts are.
                generation = GenerationArgs(
                    max_new_tokens=data.stats_max_new_tokens,
                    temperature=data.stats_temperature,
                    generation_batch_size=train.eval_batch_size,
                )
                source = f"base-policy responses to {len(index)} prompts of {data.stats_file}"

            def part_scores(rows):
                prompts = [prompt_ids[i] for i in rows]
                if response_ids is not None:
                    return self.score(prompts, [response_ids[i] for i in rows])
                sampler = build_sampler(generation, self.hydra, self.tokenizer)
                return self.score(prompts, sampler.sample(prompts, generation).response_ids)

            scores = self.harness.dist.map_in_order(part_scores, batches(len(prompt_ids), train.eval_batch_size), what)
        scores = torch.cat(scores)
        heads = {}
        try:
            if scores.dim() == 2:
                # Each head standardised by its own statistics (model/heads.py), and the statistics of
                # their mean: what the branch answers PPO from now on, whatever its objective.
                columns = [score_statistics(column) for column in scores.T]
                heads = {"head_score_mean": [m for m, _ in columns], "head_score_std": [s for _, s in columns]}
                self.branch.head.standardise(heads["head_score_mean"], heads["head_score_std"])
                scores = (
                    (scores - scores.new_tensor(heads["head_score_mean"])) / scores.new_tensor(heads["head_score_std"])
                ).mean(-1)
            mean, std = score_statistics(scores)
        except ValueError as error:
            raise TrainingError(f"reward statistics on the reference set ({source}): {error}") from None
        return {"score_mean": mean, "score_std": std, "count": len(scores), "source": source, **heads}

    # ------------------------------------------------------------------ training
    def train_step(self) -> tuple[dict, None]:
        train, pairs, dist = self.config.train, self.train_pairs, self.harness.dist
        batch, end_of_epoch = self.batches.next()
        index, finite, stats = dist.shard(batch), True, {}
        with dist.phase("training the reward branch"):
            if index:  # a process's share of a small last batch may be empty
                regularised = train.lm_loss_weight > 0
                chosen, rejected, nll = self._pair_scores(pairs, index, "train", with_nll=regularised)
                margins = (
                    torch.tensor([pairs.margins[i] for i in index], device=chosen.device)
                    if pairs.margins is not None
                    else None
                )
                counts = self.counts[index].to(chosen.device) if self.counts is not None else None
                loss, stats = preference_loss(chosen, rejected, margins, counts)
                if regularised:  # GRM (arXiv 2406.10216): the ranking loss plus the chosen answers' LM loss
                    loss = loss + train.lm_loss_weight * nll
                    stats = {**stats, "lm_loss": nll.detach(), "loss": loss.detach()}
                finite = bool(torch.isfinite(loss))
                if finite:
                    # This process's share of the whole batch's mean loss.
                    self.harness.backward(loss * (len(index) / len(batch)))
        grad_norm = self.harness.optimizer_step(finite)
        stats = {f"train/{key}": value for key, value in weighted_means(dist, stats, len(index)).items()}
        stats.update(
            {
                "train/grad_norm": grad_norm if grad_norm is not None else float("nan"),
                **self.harness.optimizer_stats("train/"),
            }
        )
        step = self.harness.step + 1
        if (train.eval_every and step % train.eval_every == 0) or end_of_epoch or step == self.total_steps:
            stats.update(self.evaluate())
            if self.best is not None:
                self.best.offer(step, stats, self.branch)
        self.last_stats = stats
        return stats, None

    def finish(self) -> dict:
        """Before the final checkpoint: the best evaluation's branch (train.load_best_model_at_end), and the score
        statistics the checkpoint stores for PPO, of the branch it holds."""
        self.final_eval = {key: as_float(value) for key, value in self.last_stats.items() if key.startswith("eval/")}
        if self.best is not None and self.best.restore(self.branch):
            logger.info(
                "load_best_model_at_end: the branch of step %d (%s %.4f; at the end %.4f) is the one kept",
                self.best.step,
                self.best.metric,
                self.best.value,
                self.final_eval.get(self.best.metric, float("nan")),
            )
            self.final_eval = dict(self.best.stats)
        self.score_stats = self.reference_statistics()
        logger.info(
            "reward scores on the reference set (%s): mean %.4f, std %.4f",
            self.score_stats["source"],
            self.score_stats["score_mean"],
            self.score_stats["score_std"],
        )
        return {
            "reference/score_mean": self.score_stats["score_mean"],
            "reference/score_std": self.score_stats["score_std"],
        }

    def state_dict(self) -> dict:
        """The reward-branch metadata (storage/reward_branch.py) and the data position."""
        stats = self.score_stats or {}
        data = self.config.data
        return {
            "kind": REWARD_KIND,
            "format_version": REWARD_FORMAT_VERSION,
            "base_model": base_model_identity(self.hydra, self.config.model.name_or_path),
            "has_norm": self.branch.norm is not None,
            "pooling": self.branch.pooling,
            "reward_heads": self.branch.head.heads,
            "score_mean": stats.get("score_mean"),
            "score_std": stats.get("score_std"),
            "score_stats": {
                k: stats[k] for k in ("count", "source", "head_score_mean", "head_score_std") if k in stats
            },
            "eval": self.final_eval if self.score_stats else {},
            "data": {
                "apply_chat_template": data.apply_chat_template,
                "system_prompt": data.system_prompt,
                "append_eos": data.append_eos,
            },
            "batches": self.batches.state_dict(),
            **(self.best.state_dict() if self.best is not None else {}),
        }

    def load_state_dict(self, state: dict) -> None:
        if "batches" not in state:
            raise TrainingError("this reward checkpoint was written before reward runs could resume; start a new run.")
        self.batches.load_state_dict(state["batches"])
        if self.best is not None:
            self.best.load_state_dict(state)
        if state.get("score_mean") is not None:
            self.score_stats = {
                "score_mean": state["score_mean"],
                "score_std": state["score_std"],
                **state.get("score_stats", {}),
            }
            if "head_score_mean" in self.score_stats:
                self.branch.head.standardise(self.score_stats["head_score_mean"], self.score_stats["head_score_std"])
            self.final_eval = state.get("eval", {})
