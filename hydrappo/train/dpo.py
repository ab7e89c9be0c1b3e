"""Direct preference optimisation on the hydra trunk: the policy learns from preference pairs with
no reward model and no second model.

    hydrappo dpo CONFIG.yaml [--resume] [--option value ...]

What trains is the hydra's: the top N layers, a band mid-stack, or LoRA adapters on them. The
reference DPO needs is the frozen copy of those layers (or the adapters switched off), read in the
SAME `forward_hydra` pass as the policy's log-probs: the frozen layers below run once per text,
without gradients (once per run with `train.cache_split_hidden`), and a pair's prompt passes the
trainable layers once for both answers (`shared_prompt_width`, model/shared_prompt.py). TRL's
DPOTrainer instead holds a second full model, or switches LoRA adapters off in a second pass, or
precomputes the reference in a pass of its own.

The loss is algo/preference.py's (DPO, robust DPO, IPO, hinge, SimPO, plus the SFT term of RPO);
the logged statistics are TRL's (rewards/chosen, rewards/rejected, rewards/accuracies,
rewards/margins, logps/chosen, logps/rejected), and the same on the held-out pairs under eval/.
The model is written into `train.output_dir` at the end, as the SFT stage writes its own (a plain
transformers folder, or a peft adapter with LoRA).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from ..algo.preference import NEEDS_REFERENCE, PairLogps, preference_objective, sequence_logps
from ..config import DPOConfig
from ..data import DataError
from ..model import HydraModel
from ..preferences import PreferencePairs, load_preference_pairs
from .harness import enable_activation_checkpointing, prepare
from .inputs import StageInputs
from ..data import pack_sequences
from .sequences import response_part
from .sft import SFTTrainer
from .stage import BestEvaluation, EpochBatches, SplitCache, SupervisedStage, batches, total_steps_of, weighted_means

logger = logging.getLogger("hydrappo")

CONFIG_NAME = "dpo_config.yaml"


class DPOTrainer(SupervisedStage):
    """DPO (and its family) of a hydra's policy on preference pairs. Build it from a `DPOConfig`
    (`hydrappo dpo` does) or from objects as TRL's DPOTrainer is (train/api.py: `model`,
    `train_dataset` / `eval_dataset` of pairs in any of TRL's preference formats, `args` with
    DPOConfig's names flat or in sections, `processing_class`, `peft_config`)."""

    name = "dpo"
    progress = {"loss": "train/loss", "acc": "rewards/accuracies"}

    def __init__(
        self,
        config: DPOConfig | None = None,
        *,
        hydra: HydraModel | None = None,
        tokenizer=None,
        config_dir=None,
        inputs: StageInputs | None = None,
        **objects,
    ):
        inputs = prepare(
            self, DPOConfig, config, objects, hydra=hydra, tokenizer=tokenizer, config_dir=config_dir, inputs=inputs
        )
        config, hydra, tokenizer = self.config, self.hydra, self.tokenizer
        data, train, dpo = config.data, config.train, config.dpo
        if hydra.value_head is not None:  # the value head is PPO's business
            hydra.value_head.requires_grad_(False)
        params = [p for p in hydra.parameters() if p.requires_grad]
        if not params:
            raise DataError(
                "nothing to train: model.num_layers_unfrozen is 0 and the lm_head is frozen; set num_layers_unfrozen "
                ">= 1, a band (model.trainable_layers) or LoRA."
            )
        self.loss_types = dpo.loss_types
        self.needs_reference = bool(set(self.loss_types) & set(NEEDS_REFERENCE))
        if self.needs_reference and hydra.shares_reference:
            raise DataError(
                "DPO compares the policy with its reference, and with nothing of the policy's layers training the "
                "two are the same model; train some layers (model.num_layers_unfrozen >= 1, or a band)."
            )
        if config.model.gradient_checkpointing:
            enable_activation_checkpointing(hydra.model)

        # The tables were read and checked before the model loaded (train/inputs.py).
        pairs = load_preference_pairs(data.train_file, tokenizer, data, table=inputs.train)
        self.train_pairs = pairs.usable(inputs.train_rows)
        if inputs.eval is not None:
            self.eval_pairs = load_preference_pairs(data.eval_file, tokenizer, data, table=inputs.eval).usable()
        else:
            self.eval_pairs = pairs.usable(inputs.eval_rows)
        if not len(self.train_pairs):
            raise DataError("no training pair is left once the pairs without room are taken out; see the warning.")
        logger.info(
            "dpo (%s, beta %g): %d training pairs, %d held-out pairs",
            "+".join(self.loss_types),
            dpo.beta,
            len(self.train_pairs),
            len(self.eval_pairs),
        )
        # With the whole model training nothing is frozen to cache.
        self.split_cache = SplitCache(hydra, train.cache_split_hidden and not hydra.full_model)
        self.total_steps = total_steps_of(train, len(self.train_pairs))
        self.batches = EpochBatches(len(self.train_pairs), train.batch_size, train.seed)
        self.best = BestEvaluation.of(train, len(self.eval_pairs) > 0)  # train.load_best_model_at_end
        self.harness.setup_optimizer(params, train, self.total_steps)
        self.output_dir = Path(train.output_dir)

    @property
    def trained_module(self):
        return self.hydra

    def summary(self, history: list[dict]) -> str:
        evals = [row for row in history if "eval/rewards/accuracies" in row]
        held = (
            f", held-out accuracy {evals[0]['eval/rewards/accuracies']:.3f} -> {evals[-1]['eval/rewards/accuracies']:.3f}"
            f" (margin {evals[-1]['eval/rewards/margins']:.3f})"
            if evals
            else ""
        )
        use = "lora.lora_init_adapter" if self.config.lora.lora_r > 0 else "model.name_or_path"
        return f"done: step {self.step}{held}.\nmodel: {self.output_dir} (use it as {use} in a PPO config)"

    def cache_examples(self) -> dict:
        examples = {}
        for tag, pairs in (("train", self.train_pairs), ("eval", self.eval_pairs)):
            for i in range(len(pairs)):
                examples[(tag, i, 0)] = (pairs.prompt_ids[i], pairs.chosen_ids[i])
                examples[(tag, i, 1)] = (pairs.prompt_ids[i], pairs.rejected_ids[i])
        return examples

    # ------------------------------------------------------------------ the pass
    def pair_logps(self, pairs: PreferencePairs, index: list[int], tag: str) -> PairLogps:
        """The policy's (and the reference's) summed log-probs of the chosen and rejected answers of
        pairs `index`, from ONE pass: 2 x len(index) rows, chosen first, each pair's prompt packed
        once for its two answers."""
        keys = [(tag, i, 0) for i in index] + [(tag, i, 1) for i in index]
        prompts = [pairs.prompt_ids[i] for i in index]
        answers = [pairs.chosen_ids[i] for i in index] + [pairs.rejected_ids[i] for i in index]
        input_ids, attention_mask, action_mask, width = pack_sequences(
            prompts + prompts, answers, self.tokenizer.pad_token_id
        )
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        action_mask = action_mask.to(self.device)
        # The first answer token is predicted at the last prompt column: the prompt's positions skip
        # the lm_head (forward_hydra's logprobs_from).
        offset = width - 1
        with self.harness.autocast():
            split = self.split_cache(keys, input_ids, attention_mask) if self.split_cache.enabled else None
            out = self.hydra.forward_hydra(
                input_ids,
                attention_mask,
                return_reference=self.needs_reference,
                logprobs_from=offset,
                split_hidden=split,
                shared_prompt_width=width if split is not None else None,
            )
        out = response_part(out, width)
        logps, tokens = sequence_logps(out.logprobs, action_mask)
        half = len(index)
        ref = sequence_logps(out.ref_logprobs, action_mask)[0] if out.ref_logprobs is not None else None
        return PairLogps(
            chosen=logps[:half],
            rejected=logps[half:],
            chosen_tokens=tokens[:half],
            rejected_tokens=tokens[half:],
            ref_chosen=ref[:half] if ref is not None else None,
            ref_rejected=ref[half:] if ref is not None else None,
        )

    def objective(self, logps: PairLogps):
        dpo = self.config.dpo
        weights = tuple(dpo.loss_weights) if dpo.loss_weights is not None else None
        return preference_objective(
            logps,
            self.loss_types,
            weights,
            beta=dpo.beta,
            label_smoothing=dpo.label_smoothing,
            simpo_gamma=dpo.simpo_gamma,
        )

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self, pairs: PreferencePairs | None = None, tag: str = "eval") -> dict:
        """The loss and TRL's statistics over all of `pairs` (default: the held-out pairs), as
        means over pairs; the batches shared among the processes."""
        pairs = self.eval_pairs if pairs is None else pairs
        if not len(pairs):
            return {}
        was_training = self.hydra.training
        self.hydra.eval()

        def stats_of(index):
            _, stats = self.objective(self.pair_logps(pairs, index, tag))
            return {key: float(value) for key, value in stats.items()}, len(index)

        parts = self.harness.dist.map_in_order(
            stats_of,
            batches(len(pairs), max(1, self.config.train.eval_batch_size // 2)),
            f"evaluating on the {tag} pairs",
        )
        self.hydra.train(was_training)
        count = sum(n for _, n in parts)
        return {f"{tag}/{key}": sum(stats[key] * n for stats, n in parts) / count for key in parts[0][0]}

    def before_training(self) -> dict:
        return self.evaluate()

    # ------------------------------------------------------------------ training
    def train_step(self) -> tuple[dict, None]:
        train, pairs, dist = self.config.train, self.train_pairs, self.harness.dist
        batch, end_of_epoch = self.batches.next()
        index, finite, stats = dist.shard(batch), True, {}
        self.hydra.train(self.config.model.gradient_checkpointing)
        with dist.phase("training on preference pairs"):
            if index:  # a process's share of a small last batch may be empty
                loss, stats = self.objective(self.pair_logps(pairs, index, "train"))
                finite = bool(torch.isfinite(loss))
                if finite:
                    # This process's share of the whole batch's mean loss.
                    self.harness.backward(loss * (len(index) / len(batch)))
        grad_norm = self.harness.optimizer_step(finite)
        self.hydra.eval()
        stats = weighted_means(dist, stats, len(index))
        stats = {("train/loss" if key == "loss" else key): value for key, value in stats.items()}
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
                self.best.offer(step, stats, self.hydra)
        return stats, None

    def finish(self) -> dict:
        """Before the final checkpoint: the best evaluation's weights (train.load_best_model_at_end), then the
        trained model written as a transformers folder (or a peft adapter)."""
        if self.best is not None and self.best.restore(self.hydra):
            logger.info(
                "load_best_model_at_end: the weights of step %d (%s %.4f) are the ones kept",
                self.best.step,
                self.best.metric,
                self.best.value,
            )
        with self.harness.dist.phase("saving the trained model"):
            if self.harness.dist.is_main:
                self.save_model()
                logger.info("dpo model saved to %s", self.output_dir)
        return {}

    # The model folder is written as the SFT stage writes its own (a plain transformers folder, or a
    # peft adapter; a quantized trunk's frozen bottom re-read in full precision).
    def save_model(self, output_dir=None):
        """The trained model (or LoRA adapter) into `output_dir` (default train.output_dir)."""
        return SFTTrainer.save_model(self, output_dir, CONFIG_NAME)

    def state_dict(self) -> dict:
        return {"batches": self.batches.state_dict(), **(self.best.state_dict() if self.best is not None else {})}

    def load_state_dict(self, state: dict) -> None:
        self.batches.load_state_dict(state["batches"])
        if self.best is not None:
            self.best.load_state_dict(state)
