"""Supervised fine-tuning of the top N layers (or LoRA adapters): the first stage of RLHF.

    hydrappo sft CONFIG.yaml [--resume] [--option value ...]

Prompt/response pairs; the loss is the mean negative log-likelihood of the RESPONSE
tokens only (algo/losses.py `response_nll`). The model is the same hydra trunk PPO uses:
the bottom L - N layers stay frozen and run without gradients (once per example with
`train.cache_split_hidden`), and the log-probs come from the hydra's chunked code, so the
full (B, T, vocab) logits tensor never exists. Checkpoints (every `save_every` steps)
resume exactly, as PPO's do.

The result is written into `train.output_dir` at the end: a plain transformers model
directory (safetensors weights, config, tokenizer with its chat template) to point
`model.name_or_path` of a PPO config at, so that PPO's frozen reference is the SFT
policy; or, with LoRA (`lora.lora_r > 0`), a peft adapter (adapter_config.json,
adapter_model.safetensors) that loads with `PeftModel.from_pretrained(base, output_dir)`
and that PPO starts from with `lora.lora_init_adapter: output_dir`. Because only the top
layers changed, the frozen bottom is the base model's, so a reward branch trained on the
base model also fits it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import yaml

from ..algo.losses import response_nll
from ..config import SFTConfig
from ..data import DataError, load_sft_rows
from ..model import HydraModel
from ..storage.export import save_model_dir
from ..storage.models import unquantized_copy
from .harness import enable_activation_checkpointing, prepare
from .inputs import StageInputs
from ..data import pack_sequences
from .sequences import response_part
from .stage import EpochBatches, SplitCache, SupervisedStage, batches, total_steps_of, weighted_means

logger = logging.getLogger("hydrappo")

CONFIG_NAME = "sft_config.yaml"


class SFTTrainer(SupervisedStage):
    """Supervised fine-tuning of a hydra's policy (its top N layers, optionally the lm_head
    and final norm, or LoRA adapters) on prompt/response pairs. Build it from an `SFTConfig`
    (`hydrappo sft` does) or from objects as PPOTrainer is (train/api.py: `model`,
    `train_dataset` / `eval_dataset` of prompt/response rows, `args`, `processing_class`)."""

    name = "sft"
    progress = {"loss": "train/loss"}
    # train(): evaluates at step 0, per epoch (or eval_every) and at the end; the model (or
    # adapter) is written into output_dir before the final checkpoint.

    def __init__(
        self,
        config: SFTConfig | None = None,
        *,
        hydra: HydraModel | None = None,
        tokenizer=None,
        config_dir=None,
        inputs: StageInputs | None = None,
        **objects,
    ):
        inputs = prepare(
            self, SFTConfig, config, objects, hydra=hydra, tokenizer=tokenizer, config_dir=config_dir, inputs=inputs
        )
        config, hydra, tokenizer = self.config, self.hydra, self.tokenizer
        data, train = config.data, config.train
        # Only the policy learns here: the value head is PPO's business.
        if hydra.value_head is not None:
            hydra.value_head.requires_grad_(False)
        params = [p for p in hydra.parameters() if p.requires_grad]
        if not params:
            raise DataError(
                "nothing to train: model.num_layers_unfrozen is 0 and the lm_head is frozen; set num_layers_unfrozen >= 1."
            )
        if config.model.gradient_checkpointing:
            enable_activation_checkpointing(hydra.model)

        # The tables were read and checked before the model loaded (train/inputs.py).
        _, prompt_ids, response_ids = load_sft_rows(data.train_file, tokenizer, data, table=inputs.train)
        pick = lambda rows, index: [rows[i] for i in index]  # noqa: E731
        self.train_set = (pick(prompt_ids, inputs.train_rows), pick(response_ids, inputs.train_rows))
        if inputs.eval is not None:
            self.eval_set = load_sft_rows(data.eval_file, tokenizer, data, table=inputs.eval)[1:]
        else:
            self.eval_set = (pick(prompt_ids, inputs.eval_rows), pick(response_ids, inputs.eval_rows))
        logger.info("sft: %d training examples, %d held-out examples", len(self.train_set[0]), len(self.eval_set[0]))

        # With the whole model training nothing is frozen to cache.
        self.split_cache = SplitCache(hydra, train.cache_split_hidden and not hydra.full_model)
        self.total_steps = total_steps_of(train, len(self.train_set[0]))
        self.batches = EpochBatches(len(self.train_set[0]), train.batch_size, train.seed)
        self.harness.setup_optimizer(params, train, self.total_steps)
        self.output_dir = Path(train.output_dir)

    def summary(self, history: list[dict]) -> str:
        evals = [row for row in history if "eval/loss" in row]
        loss = f", held-out response loss {evals[0]['eval/loss']:.4f} -> {evals[-1]['eval/loss']:.4f}" if evals else ""
        use = "lora.lora_init_adapter" if self.config.lora.lora_r > 0 else "model.name_or_path"
        return f"done: step {self.step}{loss}.\nmodel: {self.output_dir} (use it as {use} in a PPO config)"

    @property
    def trained_module(self):
        return self.hydra

    def cache_examples(self) -> dict:
        examples = {}
        for tag, (prompt_ids, response_ids) in (("train", self.train_set), ("eval", self.eval_set)):
            examples.update({(tag, i): (prompt_ids[i], response_ids[i]) for i in range(len(prompt_ids))})
        return examples

    def response_logprobs(self, keys, prompt_ids, response_ids):
        """Log-probs (B, R) of the response tokens under the policy, and their mask."""
        input_ids, attention_mask, action_mask, width = pack_sequences(
            prompt_ids, response_ids, self.tokenizer.pad_token_id
        )
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        # The first response token is predicted at the last prompt column: skip the
        # prompt's positions in the lm_head (hydra's logprobs_from).
        offset = width - 1
        with self.harness.autocast():
            if self.split_cache.enabled:
                split = self.split_cache(keys, input_ids, attention_mask)
                out = self.hydra.forward_top(split, input_ids, attention_mask, logprobs_from=offset)
            else:
                out = self.hydra.forward_hydra(input_ids, attention_mask, return_reference=False, logprobs_from=offset)
        return response_part(out, width).logprobs, action_mask.to(self.device)

    @torch.no_grad()
    def evaluate(self, dataset=None, tag: str = "eval") -> dict:
        """Token-mean response NLL over a (prompt_ids, response_ids) set (default: held out), its
        batches shared among the processes."""
        prompt_ids, response_ids = self.eval_set if dataset is None else dataset
        if not prompt_ids:
            return {}
        was_training = self.hydra.training
        self.hydra.eval()

        def nll_of(index):
            logprobs, mask = self.response_logprobs(
                [(tag, i) for i in index], [prompt_ids[i] for i in index], [response_ids[i] for i in index]
            )
            nll, count = response_nll(logprobs, mask)
            return nll.item() * count.item(), count.item()

        parts = self.harness.dist.map_in_order(
            nll_of, batches(len(prompt_ids), self.config.train.eval_batch_size), f"evaluating on the {tag} set"
        )
        total, tokens = 0.0, 0.0
        for part_total, part_tokens in parts:
            total += part_total
            tokens += part_tokens
        self.hydra.train(was_training)
        return {f"{tag}/loss": total / max(tokens, 1.0), f"{tag}/tokens": tokens}

    def before_training(self) -> dict:
        return self.evaluate()

    def train_step(self) -> tuple[dict, None]:
        train, dist = self.config.train, self.harness.dist
        batch, end_of_epoch = self.batches.next()
        prompt_ids, response_ids = self.train_set
        # Every process knows every example's length, so the whole batch's token count too.
        batch_tokens = sum(len(response_ids[i]) for i in batch)
        index, finite, stats = dist.shard(batch), True, {}
        self.hydra.train(self.config.model.gradient_checkpointing)
        with dist.phase("fine-tuning"):
            if index:  # a process's share of a small last batch may be empty
                logprobs, mask = self.response_logprobs(
                    [("train", i) for i in index], [prompt_ids[i] for i in index], [response_ids[i] for i in index]
                )
                loss, tokens = response_nll(logprobs, mask)
                finite = bool(torch.isfinite(loss))
                if finite:
                    # This process's share of the whole batch's token-mean loss.
                    self.harness.backward(loss * (tokens / max(batch_tokens, 1)) if dist.enabled else loss)
                stats = {"train/loss": loss.detach()}
        grad_norm = self.harness.optimizer_step(finite)
        self.hydra.eval()
        stats = weighted_means(dist, stats, tokens.item() if index else 0)
        stats.update(
            {
                "train/tokens": batch_tokens,
                "train/grad_norm": grad_norm if grad_norm is not None else float("nan"),
                **self.harness.optimizer_stats("train/"),
            }
        )
        step = self.harness.step + 1
        if (train.eval_every and step % train.eval_every == 0) or end_of_epoch or step == self.total_steps:
            stats.update(self.evaluate())
        return stats, None

    def finish(self) -> dict:
        with self.harness.dist.phase("saving the fine-tuned model"):
            if self.harness.dist.is_main:
                self.save_model()
                logger.info("sft model saved to %s", self.output_dir)
        return {}

    def save_model(self, output_dir=None, config_name: str = CONFIG_NAME) -> Path:
        """The fine-tuned model (or LoRA adapter) into `output_dir` (default train.output_dir, where
        a finished run writes it), with the run's config as `config_name`; trained on a quantized
        trunk, the model is written in full precision (its frozen bottom re-read from the original
        weights). The DPO stage writes its model the same way."""
        if self.hydra.uses_lora:
            model = self.hydra.peft_model
        elif self.hydra.trunk_quantization != "none":
            model = unquantized_copy(self.hydra, self.config.model, seed=self.config.train.seed).model
        else:
            model = self.hydra.model
        config_yaml = yaml.safe_dump(self.config.to_dict(), sort_keys=False)
        return save_model_dir(model, self.tokenizer, output_dir or self.output_dir, {config_name: config_yaml})

    def state_dict(self) -> dict:
        return {"batches": self.batches.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.batches.load_state_dict(state["batches"])
