"""TRL's config names, as a TRL user types them, in a YAML file or on the command line: GRPOConfig's
for an RL run, and the TrainingArguments names of TRL's RewardConfig, SFTConfig and DPOConfig for
the stages (STAGE_TRL_NAMES).

A name that means the same as a hydrappo option is taken as that option (`--num_generations 4`
is `--samples_per_prompt 4`); one whose meaning differs is refused with the hydrappo options that
say it. The meanings were read from TRL 1.16's trl/trainer/grpo_config.py; docs/your-model-your-data.md
holds the same table. Names TRL and hydrappo share (learning_rate, temperature, top_p, top_k, seed,
output_dir, reward_weights, importance_sampling_level) need nothing here; of those shared,
generation_batch_size and gradient_accumulation_steps mean other things (the table says what).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .options import ConfigError


@dataclass(frozen=True)
class TrlName:
    option: str | None  # the hydrappo option it is (a field name); None: refused, see `instead`
    values: dict = field(default_factory=dict)  # TRL's value (lower-case text) -> hydrappo's; empty: as given
    instead: str = ""  # what to write in hydrappo, for a refused name or value


_KL = (
    "--init_kl_coef {value} --kl_penalty loss --kl_estimator k3 --kl_controller fixed (TRL's beta is the coefficient "
    "of the k3 KL estimate added to the loss; beta 0 is --init_kl_coef 0, which skips the reference pass)"
)
_BATCH = (
    "hydrappo counts rollouts over all processes: ppo.batch_size rollouts (prompts x samples_per_prompt) per "
    "step, ppo.mini_batch_size rollouts per optimizer step, ppo.ppo_epochs passes over each batch"
)
TRL_NAMES = {
    "num_generations": TrlName("samples_per_prompt"),
    "num_generations_eval": TrlName("eval_samples_per_prompt"),
    "max_completion_length": TrlName("max_new_tokens"),
    "num_iterations": TrlName("ppo_epochs"),
    "epsilon": TrlName("cliprange"),
    "epsilon_high": TrlName("cliprange_high"),
    "mask_truncated_completions": TrlName("mask_truncated"),
    "beta": TrlName("init_kl_coef", {"0": 0.0, "0.0": 0.0}, _KL),
    "loss_type": TrlName(
        "loss_agg_mode",
        {"grpo": "seq-mean-token-mean", "dapo": "token-mean", "bnpo": "token-mean"},
        "dr_grpo (a token sum per sequence over a constant): --loss_agg_mode seq-mean-token-sum, the "
        "same up to the constant 1/max_completion_length of the learning rate; cispo, sapo, luspo "
        "and vespo have no hydrappo counterpart",
    ),
    "scale_rewards": TrlName(
        "advantage_estimator",
        {"group": "grpo", "true": "grpo", "none": "dr_grpo", "false": "dr_grpo"},
        "batch (scaling by the batch's std) has no hydrappo counterpart: --advantage_estimator grpo "
        "scales by the group's std, dr_grpo not at all",
    ),
    "per_device_train_batch_size": TrlName(None, instead=_BATCH),
    "steps_per_generation": TrlName(None, instead=_BATCH),
    "max_steps": TrlName(
        None,
        instead="TRL counts optimizer steps; a hydrappo step is one batch of rollouts and its "
        "ppo_epochs x batch_size / mini_batch_size optimizer steps: set train.total_steps",
    ),
    "num_train_epochs": TrlName(None, instead="hydrappo draws prompts in epochs without end: set train.total_steps"),
}


# The supervised stages' (reward, sft, dpo): the names TRL's RewardConfig, SFTConfig and DPOConfig
# share from transformers' TrainingArguments, read from TRL 1.16. A stage step is one optimizer step
# over `batch_size` examples, as TRL's is with one process and no gradient accumulation.
STAGE_TRL_NAMES = {
    "num_train_epochs": TrlName("epochs"),
    "per_device_train_batch_size": TrlName("batch_size"),
    "per_device_eval_batch_size": TrlName("eval_batch_size"),
    "max_completion_length": TrlName("max_response_length"),
    "eval_steps": TrlName("eval_every"),
    "save_steps": TrlName("save_every"),
    "save_total_limit": TrlName("keep_last"),
    "lr_scheduler_type": TrlName("lr_scheduler"),
    "max_length": TrlName(
        None,
        instead="the sft stage cuts the prompt and the response on their own: set data.max_prompt_length and "
        "data.max_response_length (the reward and dpo stages take data.max_length as TRL does)",
    ),
    "gradient_accumulation_steps": TrlName(
        None,
        instead="a stage's step is one optimizer step over train.batch_size examples, counted over all "
        "processes: set train.batch_size to TRL's per_device_train_batch_size x gradient_accumulation_steps x processes",
    ),
    "warmup_ratio": TrlName(
        None, instead="set train.warmup_steps (the steps are train.max_steps, or epochs x batches)"
    ),
}


def names_for(valid: set) -> dict:
    """The TRL names of the config whose options are `valid`: GRPOConfig's for an RL run (the one
    config with samples_per_prompt), TrainingArguments' for a stage."""
    return TRL_NAMES if "samples_per_prompt" in valid else STAGE_TRL_NAMES


def translate(name: str, value, where: str, names: dict | None = None) -> tuple[str, object]:
    """(hydrappo option, value) of TRL's `name` = `value`; ConfigError for a name or value whose
    meaning differs, saying what to write instead. `where` names the file or the command line."""
    names = TRL_NAMES if names is None else names
    entry = names[name]
    if entry.option is None:
        trainer = "GRPOConfig" if names is TRL_NAMES else "trainer"
        raise ConfigError(
            f"{where}: {name} is TRL's {trainer} option, which hydrappo does not take as it is: {entry.instead}."
        )
    if not entry.values:
        return entry.option, value
    key = str(value).strip().lower()
    if key not in entry.values:
        try:  # a number written another way (beta: 0e0)
            key = next(k for k in entry.values if float(k) == float(key))
        except (ValueError, StopIteration):
            raise ConfigError(
                f"{where}: {name}={value!r} (TRL's GRPOConfig) has no hydrappo option of the same meaning; accepted "
                f"values: {', '.join(entry.values)} (as --{entry.option}). Instead: {entry.instead.format(value=value)}."
            ) from None
    return entry.option, entry.values[key]


def translate_yaml(key: str, value, valid: set, source: str) -> tuple[str, object] | None:
    """A YAML key that is TRL's name for an option of this config (in any section: TRL's config is
    flat), as (option, value); None when it is none."""
    names = names_for(valid)
    if key in valid:  # this config's own option (a stage's max_length, dpo's beta and loss_type)
        return None
    if key in names and (names[key].option is None or names[key].option in valid):
        return translate(key, value, source, names)
    return None


def translate_words(words: list[str], valid: set) -> list[str]:
    """Command-line words with TRL's option names (`--num_generations 4`, `--beta=0`) spelt as hydrappo's."""
    names = names_for(valid)
    out, index = [], 0
    while index < len(words):
        word = words[index]
        name, eq, value = word[2:].partition("=")
        name = name.replace("-", "_")
        if not word.startswith("--") or name not in names or name in valid:
            out.append(word)
            index += 1
            continue
        if not eq:
            if index + 1 >= len(words) or words[index + 1].startswith("--"):
                raise ConfigError(f"command line: --{name} (TRL's name for --{names[name].option}) needs a value.")
            value, index = words[index + 1], index + 1
        option, translated = translate(name, value, "command line", names)
        out.append(f"--{option}={translated}")
        index += 1
    return out
