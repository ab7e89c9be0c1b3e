"""Reward sources behind one interface.

A reward source is a callable
    source(samples, prompts, outputs, step=None, *, columns=None, completion_ids=None, branch_scores=None)
returning float32 scores of shape (B,), where `samples[i] == prompts[i] + outputs[i]`,
`columns` maps each dataset column other than the prompt to its B row-aligned values and
`branch_scores` are the reward branch's scores from the policy's own forward pass. Kinds:

- `FunctionReward`: a user's Python function, from "package.module:function" or
  "path/to/file.py:function" (loaded by reward_files.py), in trlX's convention `fn(samples, prompts, outputs, **columns)`
  or TRL's `fn(prompts, completions, **columns)` (`function_convention` says which).
- `ClassifierReward`: an `AutoModelForSequenceClassification` directory or Hub id.
- `BranchReward`: the hydra reward branch (`reward.use_reward_branch`).
- `RewardSources`: any of them together, scored as a weighted sum; `build_reward_source`
  always returns one, with one entry per source the config names (`reward_source_names`).

Each kind is a class registered with `@reward_source` under its `kind`, the name of its row in
config/reward_sources.py's SOURCE_KINDS (which options name it): a new kind is a class here and
a row there.
"""

from __future__ import annotations

import inspect
import pickle
from pathlib import Path

import torch

from . import usercode
from .config.reward_sources import NO_REWARD_SOURCE, reward_source_names, weights_problem
from .errors import RewardError, RewardFunctionError, refused_pickle  # noqa: F401 (also this module's API)
from .model.heads import widened
from .reward_calls import TRL_EXTRAS, await_together, call_arguments, missing_value
from .reward_files import load_reward_function, resolve_path
from .reward_scores import _sample, _to_scores


def _where(source: str, step: int | None) -> str:
    return f"{source} at step {step}" if step is not None else source


def callable_name(fn) -> str:
    """The name a reward function object is logged under (env/reward/<name>)."""
    return getattr(fn, "__name__", None) or type(fn).__name__


def callable_spec(fn) -> str:
    """'module:qualname' of a function object: what a run's config.yaml records for it
    (importable again where the module is)."""
    module = getattr(fn, "__module__", None) or type(fn).__module__
    return f"{module}:{getattr(fn, '__qualname__', None) or type(fn).__qualname__}"


RESERVED_ARGUMENTS = ("samples", "prompts", "outputs", "completions", "completion_ids")
CONVENTIONS = {
    "trlX": ("samples", "prompts", "outputs"),
    "TRL": ("prompts", "completions", "completion_ids", *TRL_EXTRAS),
}


def function_convention(fn, spec: str) -> tuple[str, dict, bool]:
    """("trlX" | "TRL", {parameter name: inspect.Parameter}, whether it takes **kwargs) of a
    reward function, decided by its first parameter: `samples` is trlX's
    fn(samples, prompts, outputs, **kwargs); `prompts` or `completions` is TRL's
    fn(prompts, completions, completion_ids, **kwargs). Anything else is a RewardError."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as error:
        raise RewardError(
            f"reward.reward_fn={spec!r}: its parameters cannot be read ({error}); wrap it in a def."
        ) from None
    kinds = inspect.Parameter
    params = {n: p for n, p in signature.parameters.items() if p.kind not in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD)}
    takes_any = any(p.kind is kinds.VAR_KEYWORD for p in signature.parameters.values())
    first = next(iter(signature.parameters.values()), None)
    first = first.name if first is not None and first.name in params else None
    convention = "trlX" if first == "samples" else "TRL" if first in ("prompts", "completions") else None
    positional_only = [n for n, p in params.items() if p.kind is kinds.POSITIONAL_ONLY]
    if convention is None or positional_only:
        raise RewardError(
            f"reward.reward_fn={spec!r} has the parameters {signature}, which fit neither reward function convention: "
            "trlX's fn(samples, prompts, outputs, **kwargs) (first parameter `samples`) or TRL's "
            "fn(prompts, completions, **kwargs) (first parameter `prompts` or `completions`); every argument is "
            "passed by name, dataset columns as keyword arguments. Rename its parameters to one of them."
        )
    return convention, params, takes_any


SOURCE_CLASSES: dict[str, type] = {}  # kind (a row of config/reward_sources.py's SOURCE_KINDS) -> its class


def reward_source(cls):
    """Register a reward source class under its `kind`. build_reward_source makes each source a
    config names with `cls.build(what, reward_args, base_dir=, device=, functions=)`, and logs its
    scores under the source's `name`."""
    SOURCE_CLASSES[cls.kind] = cls
    return cls


@reward_source
class FunctionReward:
    """A Python function returning one number per sample, called with keyword arguments in
    trlX's convention `fn(samples=, prompts=, outputs=, **columns)` or TRL's
    `fn(prompts=, completions=, completion_ids=, **columns)` (`function_convention`);
    each argument and column goes only to a function that names it or takes **kwargs. `prompts` is
    the prompt text as the data holds it (before any chat template); conversational prompts (message
    lists) reach TRL's convention as TRL passes them, and trlX's as their formatted text (prompts.py).

    `spec` is "package.module:function" (imported from sys.path) or
    "path/to/file.py:function" (loaded from the file; a relative path is relative to
    `base_dir` if the file is there, else to the current directory)."""

    kind = "function"

    @classmethod
    def build(cls, what, reward_args, *, base_dir, device, functions):
        return functions.pop(0)  # loaded before any model (reward_functions), in the order named

    def __init__(
        self,
        spec,
        base_dir: str | Path | None = None,
        timeout_s: float | None = None,
        columns=None,
        setting: str = "data.prompts",
    ):
        if callable(spec):  # a function object (the Python API): no import
            self.fn, self.spec, self.timeout_s, self.name = spec, callable_spec(spec), timeout_s, callable_name(spec)
            self.convention, self.parameters, self.takes_any = function_convention(self.fn, self.spec)
            if columns is not None:
                self.check_columns(columns, setting)
            return
        self.spec, self.timeout_s = spec, timeout_s
        self.fn, self.name = load_reward_function(spec, base_dir)
        self.convention, self.parameters, self.takes_any = function_convention(self.fn, spec)
        if columns is not None:
            self.check_columns(columns, setting)

    def accepts(self, argument: str) -> bool:
        return self.takes_any or argument in self.parameters

    def check_columns(self, columns, setting: str = "data.prompts") -> None:
        """Refuse, before anything runs, a column named like an argument the convention
        passes, and a parameter without a default that neither the convention nor a column fills.
        `setting` names the table in the message (`data.prompts=PATH`)."""
        columns = list(columns)
        reserved = [c for c in columns if c in RESERVED_ARGUMENTS]
        if reserved:
            raise RewardError(
                f"{setting}: column {reserved[0]!r} has the name of an argument reward functions receive "
                f"({', '.join(RESERVED_ARGUMENTS)}), so it cannot be passed to {self.spec!r}; rename the column."
            )
        given = set(CONVENTIONS[self.convention]) | set(columns)
        needed = [n for n, p in self.parameters.items() if p.default is inspect.Parameter.empty and n not in given]
        if needed:
            raise RewardError(
                f"reward.reward_fn={self.spec!r} needs argument {needed[0]!r}, which is neither one of the "
                f"{self.convention} convention's ({', '.join(CONVENTIONS[self.convention])}) nor a column of "
                f"{setting} (columns: {', '.join(columns) or 'none besides the prompt'}); add that column, give the "
                "parameter a default, or fix its name."
            )

    def __call__(
        self,
        samples: list[str],
        prompts: list[str],
        outputs: list[str],
        step: int | None = None,
        *,
        columns: dict | None = None,
        completion_ids=None,
        branch_scores=None,
        prompt_messages=None,
        row_names=None,
        context=None,
        defer: bool = False,
    ):
        """Scores (B,) of one batch; `step` (the training step) goes into error messages;
        `columns` {name: B values} and `completion_ids` (B lists of token ids) go to a function
        that takes them. `prompt_messages`: the message lists of conversational prompts (then
        `prompts` are their formatted texts), which TRL's convention gets in TRL's shapes.
        `row_names`: where each sample's row is ("data.prompts row 17"), for error messages. `context`: TRL's
        trainer_state, log_metric, log_extra (reward_calls.RewardContext). An `async def` function's awaitable
        is awaited here, or with `defer` returned as (awaitable, finish) for RewardSources to await together."""
        if not len(samples) == len(prompts) == len(outputs):
            raise ValueError(
                f"samples, prompts and outputs differ in length: {len(samples)}, {len(prompts)}, {len(outputs)}."
            )
        where = _where(f"reward function {self.spec!r}", step)
        kwargs = call_arguments(
            self.convention,
            self.accepts,
            samples,
            prompts,
            outputs,
            columns=columns,
            completion_ids=completion_ids,
            prompt_messages=prompt_messages,
            context=context,
        )
        try:
            result = usercode.call_with_timeout(
                lambda **kw: usercode.call(self.fn, where, **kw), kwargs, self.timeout_s
            )
        except usercode.TimedOut:
            raise RewardFunctionError(
                f"{where} did not return within reward.timeout_s={self.timeout_s} s for {len(samples)} samples; make it "
                f"faster or raise reward.timeout_s.{_sample(prompts, outputs, 0)}"
            ) from None
        except usercode.UserCodeError:
            raise
        except Exception as error:
            return self._failed(error, where, kwargs, columns, row_names, prompts, outputs)

        def finish(result):
            if isinstance(result, Exception):
                return self._failed(result, where, kwargs, columns, row_names, prompts, outputs)
            return _to_scores(result, len(samples), where, prompts, outputs)

        if inspect.isawaitable(result):  # TRL's async reward functions
            return (result, finish) if defer else finish(await_together([result])[0])
        return finish(result)

    @staticmethod
    def _failed(error, where, kwargs, columns, row_names, prompts, outputs):
        row, shown = missing_value(kwargs, columns or {}, row_names)  # a row without a value: the likely cause
        raise RewardFunctionError(
            f"{where} raised {type(error).__name__}: {error}{usercode.user_frame(error)}. It was called on {len(outputs)} "
            f"samples.{shown}{_sample(prompts, outputs, row)} Fix the function (or the data), or rerun with --debug."
        ) from error


@reward_source
class ClassifierReward:
    """Scores prompt + response text with a local sequence-classification model (and
    its own tokenizer): the logit at index `label` (-1: the last, the only one for a
    one-label reward model)."""

    kind, name = "model", "reward_model"

    @classmethod
    def build(cls, what, reward_args, *, base_dir, device, functions):
        return cls(resolve_path(what, base_dir), label=reward_args.reward_model_label, device=device)

    def __init__(
        self, path: str | Path, label: int = -1, batch_size: int = 16, device: str = "cpu", max_length: int = 512
    ):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from .storage.models import local_source

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
        return _to_scores(
            result, len(samples), _where(f"reward model {self.model.name_or_path!r}", step), prompts, outputs
        )


@reward_source
class BranchReward:
    """The hydra reward branch's scores, computed in the policy's own forward pass over the
    rollouts and handed in as `branch_scores`."""

    kind, name = "branch", "reward_branch"

    @classmethod
    def build(cls, what, reward_args, *, base_dir, device, functions):
        return cls()

    def __call__(self, samples, prompts=None, outputs=None, step: int | None = None, *, branch_scores=None, **_):
        if branch_scores is None:
            raise RewardFunctionError(
                "reward.use_reward_branch is set but no reward branch is attached (model.reward_branch_path)."
            )
        # float64 stays float64 (exact comparisons); _to_scores would make it float32
        scores = widened(branch_scores.detach()).cpu()
        if scores.shape != (len(samples),) or not torch.isfinite(scores).all():
            raise RewardFunctionError(
                f"{_where('the reward branch', step)} gave scores {scores.tolist()} for {len(samples)} samples."
            )
        return scores


class RewardSources:
    """Several reward sources as one: the score is sum_k weight_k * score_k (TRL's
    reward_weights). `last` holds each source's unweighted scores of the latest call, by
    name, for per-source logs."""

    def __init__(self, entries: list[tuple[str, float, object]]):
        if not entries:
            raise RewardError(NO_REWARD_SOURCE)
        self.entries = entries
        self.last: dict[str, torch.Tensor] = {}

    @property
    def names(self) -> list[str]:
        return [name for name, _, _ in self.entries]

    def __call__(self, samples, prompts=None, outputs=None, step: int | None = None, **inputs) -> torch.Tensor:
        """A sample a source returned None for (NaN) counts 0 in the sum, as in TRL (nansum); one no source
        scored is NaN: unscored."""
        results = {
            name: source(samples, prompts, outputs, step=step, defer=True, **inputs) for name, _, source in self.entries
        }
        pending = {name: result for name, result in results.items() if isinstance(result, tuple)}
        for (name, (_, finish)), value in zip(pending.items(), await_together([p for p, _ in pending.values()])):
            results[name] = finish(value)
        self.last = {name: widened(torch.as_tensor(results[name])) for name, _, _ in self.entries}
        total = sum(
            weight * self.last[name].nan_to_num(0.0) for name, weight, _ in self.entries
        )  # 1.0 * x, 0 + x: x exactly
        return total.masked_fill(torch.stack([v.isnan() for v in self.last.values()]).all(0), float("nan"))


def reward_functions(
    reward_args, base_dir: str | Path | None = None, columns=None, setting: str = "data.prompts"
) -> list[FunctionReward]:
    """The reward functions `RewardArgs` names, imported and checked against the data's
    `columns` (when given; `setting` names the table): what can be refused before any model loads."""
    timeout_s = getattr(reward_args, "timeout_s", None)
    return [
        FunctionReward(spec, base_dir=base_dir, timeout_s=timeout_s, columns=columns, setting=setting)
        for spec in reward_args.function_specs
    ]


def build_reward_source(
    reward_args,
    base_dir: str | Path | None = None,
    device: str = "cpu",
    columns=None,
    functions: list[FunctionReward] | None = None,
) -> RewardSources:
    """Every reward source `RewardArgs` names (`reward_source_names`), weighted by
    reward.reward_weights (1 each by default), as one RewardSources. `functions` are ones
    `reward_functions` already loaded."""
    sources = reward_source_names(reward_args)
    if not sources:
        raise RewardError(NO_REWARD_SOURCE)
    weights = getattr(reward_args, "reward_weights", None) or None  # none or an empty list: 1 each
    if (problem := weights_problem(weights, len(sources))) is not None:
        raise RewardError(str(problem))
    weights = list(weights or [1.0] * len(sources))
    functions = list(functions) if functions is not None else reward_functions(reward_args, base_dir, columns)
    entries, used = [], set()
    for (kind, what), weight in zip(sources, weights):
        source = SOURCE_CLASSES[kind].build(what, reward_args, base_dir=base_dir, device=device, functions=functions)
        unique, n = source.name, 2
        while unique in used:
            unique, n = f"{source.name}_{n}", n + 1
        used.add(unique)
        entries.append((unique, float(weight), source))
    return RewardSources(entries)
