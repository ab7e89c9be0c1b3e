"""A user's reward function as a reward source: loading it (the one user-code loader,
usercode.load_object), reading its calling convention (trlX's `fn(samples, prompts, outputs,
**columns)` or TRL's `fn(prompts, completions, **columns)`), checking the data's columns against
its parameters before anything runs, and calling it as user code."""

from __future__ import annotations

import inspect
from pathlib import Path

from .. import usercode
from ..errors import RewardError, RewardFunctionError
from .calls import await_together, call_arguments, missing_value
from .context import TRL_EXTRAS
from .scores import sample_text, to_scores, where_at


def callable_name(fn) -> str:
    """The name a reward function object is logged under (env/reward/<name>)."""
    return getattr(fn, "__name__", None) or type(fn).__name__


def callable_spec(fn) -> str:
    """'module:qualname' of a function object: what a run's config.yaml records for it
    (importable again where the module is)."""
    module = getattr(fn, "__module__", None) or type(fn).__module__
    return f"{module}:{getattr(fn, '__qualname__', None) or type(fn).__qualname__}"


def load_reward_function(spec: str, base_dir: str | Path | None = None):
    """The function `spec` names: "package.module:function" (imported from sys.path) or
    "path/to/file.py:function" (a relative path is looked up beside the config first). The import
    runs as user code, once per file (usercode.load_object)."""
    fn = usercode.load_object(spec, base_dir, "reward function", RewardError)
    if not callable(fn):
        name = spec.rpartition(":")[2]
        raise RewardError(f"reward function {spec!r}: {name!r} is not callable (it is {type(fn).__name__} {fn!r}).")
    return fn


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
        self.fn, self.name = load_reward_function(spec, base_dir), spec.rpartition(":")[2]
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
        trainer_state, log_metric, log_extra (rewards.context.RewardContext). An `async def` function's awaitable
        is awaited here, or with `defer` returned as (awaitable, finish) for RewardSources to await together."""
        if not len(samples) == len(prompts) == len(outputs):
            raise ValueError(
                f"samples, prompts and outputs differ in length: {len(samples)}, {len(prompts)}, {len(outputs)}."
            )
        where = where_at(f"reward function {self.spec!r}", step)
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
                f"faster or raise reward.timeout_s.{sample_text(prompts, outputs, 0)}"
            ) from None
        except usercode.UserCodeError:
            raise
        except Exception as error:
            return self._failed(error, where, kwargs, columns, row_names, prompts, outputs)

        def finish(result):
            if isinstance(result, Exception):
                return self._failed(result, where, kwargs, columns, row_names, prompts, outputs)
            return to_scores(result, len(samples), where, prompts, outputs)

        if inspect.isawaitable(result):  # TRL's async reward functions
            return (result, finish) if defer else finish(await_together([result])[0])
        return finish(result)

    @staticmethod
    def _failed(error, where, kwargs, columns, row_names, prompts, outputs):
        row, shown = missing_value(kwargs, columns or {}, row_names)  # a row without a value: the likely cause
        raise RewardFunctionError(
            f"{where} raised {type(error).__name__}: {error}{usercode.user_frame(error)}. It was called on {len(outputs)} "
            f"samples.{shown}{sample_text(prompts, outputs, row)} Fix the function (or the data), or rerun with --debug."
        ) from error


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
