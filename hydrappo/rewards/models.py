"""Reward sources that are models: a sequence-classification model of its own
(`ClassifierReward`, a local folder or Hub id) and the hydra's reward branch (`BranchReward`,
whose scores come from the policy's own forward pass)."""

from __future__ import annotations

import pickle
from pathlib import Path

import torch

from .. import usercode
from ..algo.ensemble import ensemble_score
from ..errors import RewardError, RewardFunctionError, refused_pickle
from ..model.heads import widened
from .scores import to_scores, where_at


class ClassifierReward:
    """Scores prompt + response text with a local sequence-classification model (and
    its own tokenizer): the logit at index `label` (-1: the last, the only one for a
    one-label reward model)."""

    kind, name = "model", "reward_model"

    @classmethod
    def build(cls, what, reward_args, *, base_dir, device, functions):
        return cls(usercode.resolve_path(what, base_dir), label=reward_args.reward_model_label, device=device)

    def __init__(
        self, path: str | Path, label: int = -1, batch_size: int = 16, device: str = "cpu", max_length: int = 512
    ):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from ..storage.models import local_source

        path = local_source(path, option="reward.reward_model")  # a Hub id: its snapshot in the Hugging Face cache
        if not path.is_dir():
            raise RewardError(f"reward model directory {str(path)!r} does not exist.")
        try:
            model, info = AutoModelForSequenceClassification.from_pretrained(
                path, dtype=torch.float32, output_loading_info=True
            )
        except (OSError, ValueError, KeyError) as error:
            raise RewardError(f"{path} is not a sequence-classification model directory: {error}") from error
        except pickle.UnpicklingError as error:
            raise RewardError(refused_pickle(error, path, "reward.reward_model") or str(error)) from None
        if info["missing_keys"]:
            # A causal LM checkpoint loads "successfully" with a randomly initialised
            # head: refuse it rather than train against random scores.
            raise RewardError(
                f"{path} has no trained classification head (missing weights: {', '.join(sorted(info['missing_keys'])[:5])}); "
                "reward_model must be a model saved as *ForSequenceClassification."
            )
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError) as error:
            raise RewardError(f"{path} has no usable tokenizer: {error}") from error

        # The model pools the rightmost token that is not its config's pad id, so pad
        # with exactly that id (the tokenizer's pad, or EOS, only when the config has
        # none); then padding cannot change a sample's score.
        text_config = model.config.get_text_config()
        pad_id = text_config.pad_token_id
        if pad_id is None:
            pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad_id is None:
            raise RewardError(
                f"{path}: neither the model config nor the tokenizer defines a pad or EOS token; set pad_token_id."
            )
        text_config.pad_token_id = pad_id
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(pad_id)
        # Right padding keeps every real token at the position it has unbatched.
        tokenizer.padding_side = "right"
        # The response is at the end of a sample: long samples lose their beginning.
        tokenizer.truncation_side = "left"

        num_labels = model.config.num_labels
        if not -num_labels <= label < num_labels:
            raise RewardError(f"reward_model_label={label} is out of range for a model with {num_labels} label(s).")
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.label, self.batch_size, self.device, self.max_length = label, batch_size, device, max_length

    @torch.no_grad()
    def __call__(
        self,
        samples: list[str],
        prompts: list[str] | None = None,
        outputs: list[str] | None = None,
        step: int | None = None,
        **_,
    ) -> torch.Tensor:
        scores = []
        for start in range(0, len(samples), self.batch_size):
            batch = self.tokenizer(
                list(samples[start : start + self.batch_size]),
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            )
            logits = self.model(
                input_ids=batch["input_ids"].to(self.device), attention_mask=batch["attention_mask"].to(self.device)
            ).logits
            scores.append(logits[:, self.label].float().cpu())
        result = torch.cat(scores) if scores else torch.zeros(0)
        return to_scores(
            result, len(samples), where_at(f"reward model {self.model.name_or_path!r}", step), prompts, outputs
        )


class BranchReward:
    """The hydra reward branch's scores, computed in the policy's own forward pass over the
    rollouts and handed in as `branch_scores`: (B,) of one head, or (B, K) of an ensemble of K
    heads, which is scored by reward.ensemble_objective (algo/ensemble.py)."""

    kind, name = "branch", "reward_branch"

    @classmethod
    def build(cls, what, reward_args, *, base_dir, device, functions):
        return cls(reward_args.ensemble_objective, reward_args.ensemble_std_weight)

    def __init__(self, objective: str = "mean", std_weight: float = 1.0):
        self.objective, self.std_weight = objective, std_weight

    def __call__(self, samples, prompts=None, outputs=None, step: int | None = None, *, branch_scores=None, **_):
        if branch_scores is None:
            raise RewardFunctionError(
                "reward.use_reward_branch is set but no reward branch is attached (model.reward_branch_path)."
            )
        # float64 stays float64 (exact comparisons); _to_scores would make it float32
        scores = widened(branch_scores.detach()).cpu()
        if scores.shape[:1] != (len(samples),) or scores.dim() > 2 or not torch.isfinite(scores).all():
            raise RewardFunctionError(
                f"{where_at('the reward branch', step)} gave scores {scores.tolist()} for {len(samples)} samples."
            )
        return ensemble_score(scores, self.objective, self.std_weight)


def ensemble_parts(branch_scores) -> dict[str, torch.Tensor]:
    """Each head's (B,) scores and their spread (population std) of an ensemble branch's (B, K)
    scores, logged beside the objective's score as env/reward/reward_branch/head_<k> and
    env/reward/reward_branch/spread; nothing for one head."""
    if branch_scores is None or branch_scores.dim() < 2:
        return {}
    scores = widened(branch_scores.detach()).cpu()
    heads = {f"reward_branch/head_{k}": scores[:, k] for k in range(scores.shape[1])}
    return {**heads, "reward_branch/spread": scores.std(-1, correction=0)}
