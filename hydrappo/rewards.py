"""Reward sources behind one interface.

A reward source is a callable `source(samples, prompts, outputs) -> Tensor` of float32
scores with shape (B,), where `samples[i] == prompts[i] + outputs[i]` (trlX's
reward_fn signature). Two kinds live here:

- `FunctionReward`: a user's Python function, from "package.module:function" or
  "path/to/file.py:function".
- `ClassifierReward`: a local `AutoModelForSequenceClassification` directory.

The third kind, the hydra reward branch (`reward.use_reward_branch`), scores the
rollouts inside the policy's own forward pass; the trainer serves it, so
`build_reward_source` returns None for it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path

import numpy as np
import torch


class RewardError(ValueError):
    """A reward source is misconfigured or returned bad scores; the message says how to fix it."""


def _resolve(path: str, base_dir: str | Path | None) -> Path:
    """Relative paths are relative to `base_dir` (a config file's folder) when the file
    exists there, else to the current directory (the trainer's rule for all paths)."""
    candidate = Path(path)
    if base_dir is not None and not candidate.is_absolute() and (Path(base_dir) / candidate).exists():
        return Path(base_dir) / candidate
    return candidate


def _to_scores(result, count: int, source: str) -> torch.Tensor:
    """A (count,) float32 CPU tensor from whatever sequence of numbers a source returned."""
    if result is None:
        raise RewardError(f"{source} returned None; it must return one score per sample (missing `return`?).")
    if isinstance(result, torch.Tensor):
        scores = result.detach().to("cpu", torch.float32)
    else:
        try:
            scores = torch.from_numpy(np.asarray(result, dtype=np.float64)).to(torch.float32)
        except (TypeError, ValueError) as error:
            raise RewardError(
                f"{source} returned {type(result).__name__} that is not numbers ({error}); "
                "return a list, tuple, numpy array or tensor of numbers, one per sample."
            ) from None
    if scores.ndim == 2 and scores.shape[1] == 1:  # a (B, 1) column, as classifiers give
        scores = scores[:, 0]
    if scores.ndim != 1 or scores.shape[0] != count:
        raise RewardError(
            f"{source} returned scores of shape {tuple(scores.shape)} for {count} samples; return one score per sample."
        )
    bad = (~torch.isfinite(scores)).nonzero().flatten().tolist()
    if bad:
        shown = ", ".join(f"{i} ({scores[i].item()})" for i in bad[:10])
        raise RewardError(f"{source} returned non-finite scores for {len(bad)} sample(s), at rows: {shown}.")
    return scores


class FunctionReward:
    """A Python function `fn(samples, prompts, outputs, **kwargs)` returning one number
    per sample, called with keyword arguments as trlX does.

    `spec` is "package.module:function" (imported from sys.path) or
    "path/to/file.py:function" (loaded from the file; a relative path is relative to
    `base_dir` if the file is there, else to the current directory)."""

    def __init__(self, spec: str, base_dir: str | Path | None = None):
        target, _, name = spec.rpartition(":")
        if not target or not name.isidentifier():
            raise RewardError(
                f"reward function {spec!r} is not of the form 'package.module:function' or 'path/to/file.py:function'."
            )
        self.spec = spec
        is_file = target.endswith(".py") or "/" in target or "\\" in target
        module = self._load_file(_resolve(target, base_dir), base_dir) if is_file else self._import(target)
        if not hasattr(module, name):
            defined = sorted(
                n for n, v in vars(module).items()
                if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == module.__name__
            )
            raise RewardError(
                f"reward function {spec!r}: {target} has no {name!r}; callables it defines: {', '.join(defined) or '(none)'}."
            )
        self.fn = getattr(module, name)
        if not callable(self.fn):
            raise RewardError(f"reward function {spec!r}: {name!r} is not callable (it is {type(self.fn).__name__} {self.fn!r}).")

    @staticmethod
    def _import(module_name: str):
        try:
            return importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            # Only our own module missing is a config problem; a missing dependency
            # inside the user's module is theirs to see as is.
            if error.name is None or not (module_name == error.name or module_name.startswith(error.name + ".")):
                raise
            raise RewardError(
                f"reward function module {module_name!r} is not importable from sys.path; install it, add its folder "
                "to PYTHONPATH, or name the file instead: 'path/to/file.py:function'."
            ) from None

    @staticmethod
    def _load_file(path: Path, base_dir):
        if not path.is_file():
            where = f" (looked in {base_dir} and the current directory)" if base_dir is not None else ""
            raise RewardError(f"reward function file {str(path)!r} does not exist{where}.")
        path = path.resolve()
        # A unique, stable module name per file, registered in sys.modules before it runs
        # so that dataclasses, pickling and the like work inside the user's file.
        digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
        module_name = f"_hydrappo_reward_{path.stem}_{digest}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[module_name]
            raise
        return module

    def __call__(self, samples: list[str], prompts: list[str], outputs: list[str]) -> torch.Tensor:
        if not len(samples) == len(prompts) == len(outputs):
            raise ValueError(f"samples, prompts and outputs differ in length: {len(samples)}, {len(prompts)}, {len(outputs)}.")
        result = self.fn(samples=list(samples), prompts=list(prompts), outputs=list(outputs))
        return _to_scores(result, len(samples), f"reward function {self.spec!r}")


class ClassifierReward:
    """Scores prompt + response text with a local sequence-classification model (and
    its own tokenizer): the logit at index `label` (-1: the last, the only one for a
    one-label reward model)."""

    def __init__(self, path: str | Path, label: int = -1, batch_size: int = 16, device: str = "cpu", max_length: int = 512):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        path = Path(path)
        if not path.is_dir():
            raise RewardError(f"reward model directory {str(path)!r} does not exist.")
        try:
            model, info = AutoModelForSequenceClassification.from_pretrained(
                path, dtype=torch.float32, output_loading_info=True
            )
        except (OSError, ValueError, KeyError) as error:
            raise RewardError(f"{path} is not a sequence-classification model directory: {error}") from error
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
            raise RewardError(f"{path}: neither the model config nor the tokenizer defines a pad or EOS token; set pad_token_id.")
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
    def __call__(self, samples: list[str], prompts: list[str] | None = None, outputs: list[str] | None = None) -> torch.Tensor:
        scores = []
        for start in range(0, len(samples), self.batch_size):
            batch = self.tokenizer(
                list(samples[start : start + self.batch_size]),
                padding=True, truncation=True, max_length=self.max_length, return_tensors="pt",
            )
            logits = self.model(
                input_ids=batch["input_ids"].to(self.device), attention_mask=batch["attention_mask"].to(self.device)
            ).logits
            scores.append(logits[:, self.label].float().cpu())
        result = torch.cat(scores) if scores else torch.zeros(0)
        return _to_scores(result, len(samples), f"reward model {self.model.name_or_path!r}")


def build_reward_source(reward_args, base_dir: str | Path | None = None, device: str = "cpu"):
    """The reward source `RewardArgs` asks for: a FunctionReward for reward_fn, a
    ClassifierReward for reward_model, and None for use_reward_branch, whose scores
    the trainer takes from the hydra forward pass itself."""
    chosen = [bool(reward_args.reward_fn), bool(reward_args.reward_model), bool(reward_args.use_reward_branch)]
    if sum(chosen) != 1:
        raise RewardError(
            "set exactly one reward source: reward.reward_fn ('module:function' or 'file.py:function'), "
            "reward.reward_model (a sequence-classification model directory) or reward.use_reward_branch: true."
        )
    if reward_args.use_reward_branch:
        return None
    if reward_args.reward_fn:
        return FunctionReward(reward_args.reward_fn, base_dir=base_dir)
    return ClassifierReward(
        _resolve(reward_args.reward_model, base_dir), label=reward_args.reward_model_label, device=device
    )
