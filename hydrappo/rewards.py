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
import numbers
import pickle
import sys
import threading
import traceback
from pathlib import Path

import numpy as np
import torch

from . import usercode
from .errors import HydrappoError, refused_pickle


class RewardError(HydrappoError, ValueError):
    """A reward source is misconfigured (exit code 2) or failed (RewardFunctionError, 1); the
    message says what to fix."""

    exit_code = 2


class RewardFunctionError(RewardError):
    """A reward source raised, hung past reward.timeout_s, or returned something that is not one
    finite number per sample. The message names the source, the step and one offending sample."""

    exit_code = 1


def _short(text: str, limit: int = 80) -> str:
    text = str(text)
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def _sample(prompts, outputs, row: int) -> str:
    if prompts is None or outputs is None or not 0 <= row < len(outputs):
        return ""
    return f" Sample {row}: prompt {_short(prompts[row])}, response {_short(outputs[row])}."


def _user_frame(error: BaseException) -> str:
    """' (file.py, line N)' of the innermost frame of a traceback outside hydrappo."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if "hydrappo" not in Path(f.filename).parts]
    return f" ({Path(frames[-1].filename).name}, line {frames[-1].lineno})" if frames else ""


class _TimedOut(Exception):
    pass


def _call_with_timeout(fn, kwargs: dict, timeout_s: float | None):
    """fn(**kwargs), in a daemon thread when there is a time limit: a call that does not
    return in time is left behind (a thread cannot be killed) and _TimedOut raised."""
    if timeout_s is None:
        return fn(**kwargs)
    box: dict = {}
    grad = torch.is_grad_enabled()

    def target():
        try:
            with torch.set_grad_enabled(grad):
                box["result"] = fn(**kwargs)
        except BaseException as error:  # handed to the caller's thread
            box["error"] = error

    thread = threading.Thread(target=target, name="hydrappo-reward-fn", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise _TimedOut
    if "error" in box:
        raise box["error"]
    return box["result"]


def _resolve(path: str, base_dir: str | Path | None) -> Path:
    """Relative paths are relative to `base_dir` (a config file's folder) when the file
    exists there, else to the current directory (the trainer's rule for all paths)."""
    candidate = Path(path)
    if base_dir is not None and not candidate.is_absolute() and (Path(base_dir) / candidate).exists():
        return Path(base_dir) / candidate
    return candidate


def _is_number(value) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return False
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return value.ndim == 0 or value.shape == (1,)
    return isinstance(value, (numbers.Real, np.number))


def _to_scores(result, count: int, source: str, prompts=None, outputs=None) -> torch.Tensor:
    """A (count,) float32 CPU tensor from whatever sequence of numbers a source returned;
    anything else is a RewardFunctionError naming `source` and showing an offending sample."""
    if result is None:
        raise RewardFunctionError(f"{source} returned None; it must return one score per sample (missing `return`?).")
    if isinstance(result, torch.Tensor):
        scores = result.detach().to("cpu", torch.float32)
    else:
        if isinstance(result, (list, tuple)):
            bad = next((i for i, value in enumerate(result) if not _is_number(value)), None)
            if bad is not None:
                raise RewardFunctionError(
                    f"{source} returned {type(result).__name__} that is not numbers: item {bad} is "
                    f"{type(result[bad]).__name__} {repr(result[bad])[:40]}; return one number per sample."
                    f"{_sample(prompts, outputs, bad)}"
                )
        try:
            scores = torch.from_numpy(np.asarray(result, dtype=np.float64)).to(torch.float32)
        except (TypeError, ValueError) as error:
            raise RewardFunctionError(
                f"{source} returned {type(result).__name__} that is not numbers ({error}); "
                f"return a list, tuple, numpy array or tensor of numbers, one per sample.{_sample(prompts, outputs, 0)}"
            ) from None
    if scores.ndim == 2 and scores.shape[1] == 1:  # a (B, 1) column, as classifiers give
        scores = scores[:, 0]
    if scores.ndim != 1 or scores.shape[0] != count:
        raise RewardFunctionError(
            f"{source} returned scores of shape {tuple(scores.shape)} for {count} samples; return one score per "
            f"sample.{_sample(prompts, outputs, 0 if scores.ndim != 1 else min(scores.shape[0], count - 1))}"
        )
    bad = (~torch.isfinite(scores)).nonzero().flatten().tolist()
    if bad:
        shown = ", ".join(f"{i} ({scores[i].item()})" for i in bad[:10])
        raise RewardFunctionError(
            f"{source} returned non-finite scores for {len(bad)} sample(s), at rows: {shown}.{_sample(prompts, outputs, bad[0])}"
        )
    return scores


def _where(source: str, step: int | None) -> str:
    return f"{source} at step {step}" if step is not None else source


class FunctionReward:
    """A Python function `fn(samples, prompts, outputs, **kwargs)` returning one number
    per sample, called with keyword arguments as trlX does.

    `spec` is "package.module:function" (imported from sys.path) or
    "path/to/file.py:function" (loaded from the file; a relative path is relative to
    `base_dir` if the file is there, else to the current directory)."""

    def __init__(self, spec: str, base_dir: str | Path | None = None, timeout_s: float | None = None):
        target, _, name = spec.rpartition(":")
        if not target or not name.isidentifier():
            raise RewardError(
                f"reward function {spec!r} is not of the form 'package.module:function' or 'path/to/file.py:function'."
            )
        self.spec, self.timeout_s = spec, timeout_s
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
            if error.name is None or not (module_name == error.name or module_name.startswith(error.name + ".")):
                raise _import_failed(f"reward function module {module_name!r}", error) from error
            raise RewardError(
                f"reward function module {module_name!r} is not importable from sys.path; install it, add its folder "
                "to PYTHONPATH, or name the file instead: 'path/to/file.py:function'."
            ) from None
        except Exception as error:
            raise _import_failed(f"reward function module {module_name!r}", error) from error

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
        except BaseException as error:
            del sys.modules[module_name]
            if isinstance(error, Exception):
                raise _import_failed(f"reward function file {str(path)!r}", error) from error
            raise
        return module

    def __call__(self, samples: list[str], prompts: list[str], outputs: list[str], step: int | None = None) -> torch.Tensor:
        """Scores (B,) of one batch; `step` (the training step) goes into error messages."""
        if not len(samples) == len(prompts) == len(outputs):
            raise ValueError(f"samples, prompts and outputs differ in length: {len(samples)}, {len(prompts)}, {len(outputs)}.")
        where = _where(f"reward function {self.spec!r}", step)
        kwargs = {"samples": list(samples), "prompts": list(prompts), "outputs": list(outputs)}
        try:
            result = _call_with_timeout(lambda **kw: usercode.call(self.fn, where, **kw), kwargs, self.timeout_s)
        except _TimedOut:
            raise RewardFunctionError(
                f"{where} did not return within reward.timeout_s={self.timeout_s} s for {len(samples)} samples; make it "
                f"faster or raise reward.timeout_s.{_sample(prompts, outputs, 0)}"
            ) from None
        except usercode.UserCodeError:
            raise
        except Exception as error:
            raise RewardFunctionError(
                f"{where} raised {type(error).__name__}: {error}{_user_frame(error)}. It was called on {len(samples)} "
                f"samples.{_sample(prompts, outputs, 0)} Fix the function, or rerun with --debug for the traceback."
            ) from error
        return _to_scores(result, len(samples), where, prompts, outputs)


def _import_failed(what: str, error: Exception) -> RewardError:
    if isinstance(error, SyntaxError):
        where = f" ({Path(error.filename or '').name}, line {error.lineno})"
    else:
        where = _user_frame(error)
    return RewardError(
        f"{what} failed to import: {type(error).__name__}: {error}{where}. Fix it (a missing module: install it), "
        "or rerun with --debug for the traceback."
    )


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
    def __call__(self, samples: list[str], prompts: list[str] | None = None, outputs: list[str] | None = None,
                 step: int | None = None) -> torch.Tensor:  # fmt: skip
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
        return _to_scores(result, len(samples), _where(f"reward model {self.model.name_or_path!r}", step), prompts, outputs)


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
        return FunctionReward(reward_args.reward_fn, base_dir=base_dir, timeout_s=getattr(reward_args, "timeout_s", None))
    return ClassifierReward(
        _resolve(reward_args.reward_model, base_dir), label=reward_args.reward_model_label, device=device
    )
