"""Every scalar a run logs (metrics.jsonl and TensorBoard, written by train/run_log.py), declared
once: its key, the stages that log it and what it measures. A key in braces, `env/reward/{source}`,
is a pattern: one key per reward source, per logged name, per loss term.

docs/metrics.md is this table as a page, generated from it:

    python -m hydrappo.train.metric_keys > docs/metrics.md

tests/train/test_metric_keys.py fails when the code logs a key that is not here (read from the
source, and from the metrics.jsonl of one tiny run of each stage) and when docs/metrics.md is not
the page this module writes. Pure data: it imports nothing of the package."""

from __future__ import annotations

import re
from dataclasses import dataclass

# The stages, as the tables name them.
STAGES = {
    "ppo": "`hydrappo train` with a value head (`ppo.advantage_estimator: gae`, the default)",
    "critic-free": "`hydrappo train` without one (GRPO, Dr. GRPO, RLOO, REINFORCE++: [critic-free](critic-free.md))",
    "eval": "the held-out evaluation of an RL run (`data.eval_prompts`, or a task's held-out items)",
    "reward": "`hydrappo reward`, which trains the reward branch ([reward model and SFT](reward-and-sft.md))",
    "sft": "`hydrappo sft` ([reward model and SFT](reward-and-sft.md))",
    "dpo": "`hydrappo dpo` ([DPO](dpo.md))",
}
RL = ("ppo", "critic-free")
SUPERVISED = ("reward", "sft", "dpo")
EVERY = (*RL, *SUPERVISED)


@dataclass(frozen=True)
class Metric:
    key: str  # the logged key, or a pattern whose {name} stands for any text
    stages: tuple[str, ...]
    meaning: str  # what it measures, with its unit where it has one

    @property
    def is_pattern(self) -> bool:
        return "{" in self.key

    def matches(self, key: str) -> bool:
        return key == self.key or (self.is_pattern and key_pattern(self.key).fullmatch(key) is not None)


@dataclass(frozen=True)
class Section:
    title: str
    text: str  # what the section's keys have in common, above its table
    metrics: tuple[Metric, ...]


def key_pattern(key: str) -> re.Pattern:
    """A pattern key as a regular expression: each {name} matches any text (at least one character)."""
    return re.compile("".join(".+" if part.startswith("{") else re.escape(part) for part in re.split(r"({\w+})", key)))


M = Metric
SECTIONS = (
    Section(
        "Common to the stages",
        "`step` is on every line; the learning rate and the gradient's statistics on every training step.",
        (
            M(
                "step",
                EVERY,
                "The step the line records (an RL step: sample, score, update; a supervised stage's optimizer "
                "step); 0 for what is measured before the first (a held-out baseline).",
            ),
            M("lr", EVERY, "The learning rate the schedule gives after this step's optimizer step."),
            M(
                "train/grad_norm",
                SUPERVISED,
                "Gradient norm before clipping (`train.max_grad_norm`); NaN when the step was skipped.",
            ),
            M(
                "train/fp16_overflows_total",
                SUPERVISED,
                "fp16 only: steps the loss scaler skipped so far for an overflow.",
            ),
        ),
    ),
    Section(
        "RL: the batch",
        "What one step's rollouts look like, over the whole batch (every process's rows), before the update. "
        "A score is the weighted sum of the reward sources' scores (`reward.reward_weights`).",
        (
            M(
                "env/reward_mean",
                RL,
                "Mean score of the batch's responses, over those some reward source scored: the training curve.",
            ),
            M("env/reward_std", RL, "Standard deviation of the batch's scores."),
            M(
                "env/reward/{source}",
                RL,
                "Mean unweighted score of one reward source (a reward function's name, "
                "`reward_model`, `reward_branch`, a task's name) or of an environment's `get_reward()` (its class "
                "name), over the responses it scored.",
            ),
            M(
                "env/reward/reward_branch/head_{k}",
                RL,
                "A reward branch of several heads (the reward stage's `train.reward_heads`): head k's mean score, "
                "standardised by its reference statistics; `env/reward/reward_branch` is then "
                "`reward.ensemble_objective`'s score of the heads.",
            ),
            M(
                "env/reward/reward_branch/spread",
                RL,
                "Mean over the responses of the heads' spread (population std of their standardised scores): "
                "where it grows, the heads disagree, and the policy has left the pairs they were trained on.",
            ),
            M(
                "env/unscored_frac",
                RL,
                "Share of responses no reward source scored (every one returned None, "
                "TRL's convention); they add nothing to the loss.",
            ),
            M(
                "env/solve_rate",
                RL,
                "Share of responses scored 1, logged when every score is 0 or 1 (a verifiable reward).",
            ),
            M(
                "env/groups_all_equal_frac",
                RL,
                "With `generation.samples_per_prompt` G > 1: share of prompts whose "
                "G responses all got the same score, which give a group baseline no signal.",
            ),
            M(
                "env/score_used_mean",
                RL,
                "Mean score the shaping receives: after `reward.score_normalization` and "
                "with DAPO's overlong penalty added.",
            ),
            M(
                "env/overlong_penalty_mean",
                RL,
                "Mean DAPO soft overlong penalty, 0 or negative (0 with `reward.overlong_buffer: 0`).",
            ),
            M(
                "env/missing_eos_frac",
                RL,
                "Share of responses that reached `generation.max_new_tokens` without an EOS or stop.",
            ),
            M(
                "env/degenerate_frac",
                RL,
                "Share of responses that end in a loop: their last 8 tokens repeat a unit "
                "of at most 4 tokens ([KL control](kl-control.md)).",
            ),
            M("tokens/responses_len_mean", RL, "Mean response length, tokens."),
            M("tokens/prompts_len_mean", RL, "Mean prompt length, tokens."),
            M("objective/kl_coef", RL, "The KL coefficient beta this step used, as the KL controller set it."),
            M(
                "objective/kl",
                RL,
                "KL from the reference to the policy on the sampled responses: log pi - log "
                "pi_ref summed over a response's tokens (k1), mean over responses, nats per response; what the KL "
                "controller steers. Absent when the reference does not run (a coefficient of 0 without "
                "`ppo.measure_kl`).",
            ),
            M(
                "objective/kl_token_mean",
                RL,
                "Mean per-token KL estimate (`ppo.kl_estimator`) over response "
                "tokens, nats per token; logged with `objective/kl`.",
            ),
            M(
                "objective/kl_seq_mean",
                RL,
                "The same estimate summed over a response's tokens, mean over "
                "responses, nats per response (equal to `objective/kl` with k1).",
            ),
            M(
                "objective/score_mean",
                RL,
                "Mean score put on a response's last token, after the missing-EOS "
                "penalty, `reward.cliprange_reward` and a group's mean subtracted where the estimator does; logged "
                "with `objective/kl`.",
            ),
            M(
                "objective/non_score_reward_mean",
                RL,
                "Mean over responses of the summed per-token KL penalty "
                "-beta * KL (0 when the KL is a loss term, `ppo.kl_penalty: loss`); logged with `objective/kl`.",
            ),
            M(
                "objective/missing_eos_frac",
                RL,
                "Share of responses without an EOS, as the shaping counted it (the "
                "same as `env/missing_eos_frac`); logged with `objective/kl`.",
            ),
            M(
                "objective/entropy",
                RL,
                "Mean per-token entropy of the policy over the sampled response tokens, nats per token.",
            ),
            M("ppo/advantages/mean", RL, "Mean advantage over response tokens (about 0 when advantages are whitened)."),
            M(
                "reward_metrics/{name}",
                RL,
                "Mean of the values a reward function logged with TRL's `log_metric(name, value)` during the step.",
            ),
            M("agent/tool_calls_mean", RL, "Agents: tool calls written per episode."),
            M("agent/valid_calls_mean", RL, "Agents: valid calls per episode (a known tool, arguments that fit)."),
            M("agent/called_validly_mean", RL, "Agents: share of episodes with at least one valid call."),
            M("agent/tool_rounds_mean", RL, "Agents: tool turns per episode."),
            M("agent/failed_calls_mean", RL, "Agents: calls per episode whose tool failed."),
            M("agent/tokens_mean", RL, "Agents: tokens per episode, tool outputs included."),
            M("agent/valid_call_rate", RL, "Agents: valid calls over calls written (absent when none was written)."),
            M("time/rollout", RL, "Seconds to sample, score and shape the batch."),
            M("oom/backoffs_total", RL, "Out-of-memory back-offs so far in the run (with `train.oom_backoff`)."),
        ),
    ),
    Section(
        "RL: the update",
        "The `ppo.ppo_epochs` passes of minibatches over the batch. A `loss/*` value is the mean of the "
        "minibatches' losses; the others are token means over the update (a `*_max` its maximum).",
        (
            M(
                "ppo/loss/total",
                RL,
                "The loss minimised: policy + `ppo.vf_coef` x value - `ppo.ent_coef` x entropy [+ beta x KL].",
            ),
            M("ppo/loss/policy", RL, "The clipped surrogate policy loss (Schulman et al. 2017)."),
            M("ppo/loss/value", ("ppo",), "The clipped value loss, 0.5 (V - R)^2, before `ppo.vf_coef`."),
            M("ppo/loss/entropy", RL, "Mean entropy term of the loss, nats per token; with `ppo.ent_coef` set."),
            M("ppo/loss/kl", RL, "The KL term of the loss (`ppo.kl_penalty: loss`), before beta."),
            M(
                "ppo/policy/approxkl",
                RL,
                "KL from the policy that sampled to the updated one (k3), nats per "
                "token: how far the update moved the policy.",
            ),
            M("ppo/policy/clipfrac", RL, "Share of tokens whose probability ratio the clip held back."),
            M("ppo/policy/dual_clipfrac", RL, "Share of tokens the dual clip bounded (`ppo.dual_clip` set)."),
            M("ppo/policy/ratio_mean", RL, "Mean probability ratio pi_new / pi_old over response tokens."),
            M("ppo/policy/ratio_max", RL, "Largest probability ratio of the update."),
            M(
                "ppo/policy/entropy",
                RL,
                "Mean per-token entropy during the update, nats per token; with `ppo.ent_coef` set.",
            ),
            M("ppo/val/mean", ("ppo",), "Mean value the value head predicts."),
            M("ppo/val/clipfrac", ("ppo",), "Share of tokens whose value the value clip held back."),
            M(
                "ppo/val/var_explained",
                ("ppo",),
                "Explained variance of the returns by the values, 1 - Var(R - "
                "V) / Var(R): 1 predicts them, 0 no better than their mean.",
            ),
            M("ppo/returns/mean", ("ppo",), "Mean return (the value head's target) over response tokens."),
            M(
                "ppo/grad_norm",
                RL,
                "Gradient norm before clipping (`ppo.max_grad_norm`), mean over the step's optimizer steps.",
            ),
            M("ppo/updates", RL, "Optimizer steps taken in this step (a skipped one is not counted)."),
            M("ppo/critic_warmup", RL, "1 while the value head trains alone (`ppo.critic_warmup_steps`), else 0."),
            M("ppo/nonfinite_skipped_total", RL, "Updates skipped so far for a non-finite loss or gradient."),
            M("ppo/fp16_overflows_total", RL, "fp16 only: steps the loss scaler skipped so far for an overflow."),
            M("time/update", RL, "Seconds of the update."),
        ),
    ),
    Section(
        "RL: held-out evaluation",
        "The policy's answers to prompts it never trains on, scored by the run's rewards: at step 0 (the "
        "baseline), every `train.eval_every` steps and at the last step. Greedy by default (`train.eval_greedy`).",
        (
            M("eval/reward_mean", ("eval",), "Mean score of the held-out answers: the curve to judge a run by."),
            M("eval/reward_std", ("eval",), "Standard deviation of the held-out scores."),
            M(
                "eval/reward/{source}",
                ("eval",),
                "Mean unweighted score of one reward source on the held-out answers it scored.",
            ),
            M(
                "eval/solved/{source}",
                ("eval",),
                "A task's verifier: share of its scored answers that solve (full score 1).",
            ),
            M("eval/solve_rate", ("eval",), "Share of answers scored 1, when every score is 0 or 1."),
            M("eval/unscored_frac", ("eval",), "Share of answers no reward source scored (absent when none)."),
            M("eval/response_len_mean", ("eval",), "Mean answer length, tokens."),
            M("eval/missing_eos_frac", ("eval",), "Share of answers without an EOS or stop."),
            M("eval/degenerate_frac", ("eval",), "Share of answers that end in a loop."),
            M("eval/prompts", ("eval",), "Held-out prompts answered."),
            M(
                "eval/answers_per_prompt",
                ("eval",),
                "Answers to each prompt, with "
                "`train.eval_samples_per_prompt` > 1 (the statistics are over all of them).",
            ),
            M(
                "eval/reward_metrics/{name}",
                ("eval",),
                "Mean of the values a reward function logged with "
                "`log_metric(name, value)` while scoring the held-out answers.",
            ),
            M("eval/agent/tool_calls_mean", ("eval",), "Agents: tool calls written per held-out episode."),
            M("eval/agent/valid_calls_mean", ("eval",), "Agents: valid calls per held-out episode."),
            M("eval/agent/called_validly_mean", ("eval",), "Agents: share of held-out episodes with a valid call."),
            M("eval/agent/tool_rounds_mean", ("eval",), "Agents: tool turns per held-out episode."),
            M("eval/agent/failed_calls_mean", ("eval",), "Agents: failed calls per held-out episode."),
            M("eval/agent/tokens_mean", ("eval",), "Agents: tokens per held-out episode."),
            M("eval/agent/valid_call_rate", ("eval",), "Agents: valid calls over calls written, held out."),
            M("time/eval", ("eval",), "Seconds of the evaluation."),
        ),
    ),
    Section(
        "Reward stage",
        "The reward branch learns which of two responses is preferred (Bradley-Terry). `train/*` is the step's "
        "batch; `eval/*` the held-out pairs, at each epoch's end (or every `train.eval_every` steps) and the last "
        "step.",
        (
            M(
                "train/loss",
                ("reward",),
                "Bradley-Terry loss, mean of -log sigmoid(r_chosen - r_rejected [- margin]), nats per pair "
                "(with `train.lm_loss_weight`, plus that weight times `train/lm_loss`).",
            ),
            M(
                "train/lm_loss",
                ("reward",),
                "With `train.lm_loss_weight` > 0 (GRM's regulariser): the chosen answers' mean NLL per token under "
                "the LM head, read from the branch's hidden states.",
            ),
            M("train/accuracy", ("reward",), "Share of pairs whose chosen response scores higher (a tie counts half)."),
            M("train/margin", ("reward",), "Mean r_chosen - r_rejected."),
            M("train/chosen_score", ("reward",), "Mean score of the chosen responses."),
            M("train/rejected_score", ("reward",), "Mean score of the rejected responses."),
            M("eval/loss", ("reward",), "`train/loss` on the held-out pairs."),
            M(
                "eval/accuracy",
                ("reward",),
                "`train/accuracy` on the held-out pairs: the number to judge a reward model by.",
            ),
            M("eval/margin", ("reward",), "`train/margin` on the held-out pairs."),
            M("eval/chosen_score", ("reward",), "`train/chosen_score` on the held-out pairs."),
            M("eval/rejected_score", ("reward",), "`train/rejected_score` on the held-out pairs."),
            M(
                "train/head_accuracy/{head}",
                ("reward",),
                "With `train.reward_heads` > 1: one head's `train/accuracy` (heads 0..K-1); `train/accuracy` and "
                "the other scores are then those of the heads' mean.",
            ),
            M("eval/head_accuracy/{head}", ("reward",), "`train/head_accuracy/{head}` on the held-out pairs."),
            M(
                "reference/score_mean",
                ("reward",),
                "TensorBoard only, at the last step: the trained branch's mean score on the reference set "
                "(`data.stats_file`, or the training pairs' responses), kept in the checkpoint for PPO's "
                "`reward.score_normalization: ref`.",
            ),
            M("reference/score_std", ("reward",), "TensorBoard only, at the last step: its standard deviation."),
        ),
    ),
    Section(
        "SFT stage",
        "Supervised fine-tuning on prompt/response rows, with no loss on the prompt.",
        (
            M("train/loss", ("sft",), "Negative log-likelihood of the batch's response tokens, nats per token."),
            M("train/tokens", ("sft",), "Response tokens in the batch."),
            M(
                "eval/loss",
                ("sft",),
                "The same loss on the held-out rows, at step 0, each epoch's end (or every "
                "`train.eval_every` steps) and the last step.",
            ),
            M("eval/tokens", ("sft",), "Response tokens in the held-out rows."),
        ),
    ),
    Section(
        "DPO stage",
        "TRL's names ([DPO](dpo.md)); the same on the held-out pairs under `eval/`, at step 0, each epoch's end "
        "(or every `train.eval_every` steps) and the last step. A reward here is the implicit one, beta x (log pi "
        "- log pi_ref) of an answer (SimPO: beta x its mean log-prob).",
        (
            M("train/loss", ("dpo",), "The loss: the weighted sum of `dpo.loss_type`'s terms."),
            M("loss/{type}", ("dpo",), "Each term of a combined loss (`loss_type: [sigmoid, sft]`)."),
            M("rewards/chosen", ("dpo",), "Mean implicit reward of the chosen answers."),
            M("rewards/rejected", ("dpo",), "Mean implicit reward of the rejected answers."),
            M(
                "rewards/accuracies",
                ("dpo",),
                "Share of pairs whose chosen reward is the larger (a tie counts as a "
                "miss: 0 at step 0, where policy and reference are one).",
            ),
            M("rewards/margins", ("dpo",), "Mean chosen minus rejected reward."),
            M("logps/chosen", ("dpo",), "Mean summed log-prob of the chosen answers under the policy, nats."),
            M("logps/rejected", ("dpo",), "Mean summed log-prob of the rejected answers under the policy, nats."),
            M("eval/loss", ("dpo",), "`train/loss` on the held-out pairs."),
            M("eval/loss/{type}", ("dpo",), "`loss/{type}` on the held-out pairs."),
            M("eval/rewards/chosen", ("dpo",), "`rewards/chosen` on the held-out pairs."),
            M("eval/rewards/rejected", ("dpo",), "`rewards/rejected` on the held-out pairs."),
            M(
                "eval/rewards/accuracies",
                ("dpo",),
                "`rewards/accuracies` on the held-out pairs: the number to judge a DPO run by.",
            ),
            M("eval/rewards/margins", ("dpo",), "`rewards/margins` on the held-out pairs."),
            M("eval/logps/chosen", ("dpo",), "`logps/chosen` on the held-out pairs."),
            M("eval/logps/rejected", ("dpo",), "`logps/rejected` on the held-out pairs."),
        ),
    ),
)
METRICS = tuple(metric for section in SECTIONS for metric in section.metrics)


def metric_of(key: str, stages=None) -> Metric | None:
    """The declared metric `key` is (a literal one before a pattern), among those logged by one of
    `stages` (None: any); None when none is."""
    candidates = [m for m in METRICS if stages is None or set(m.stages) & set(stages)]
    return next((m for m in candidates if m.key == key), None) or next((m for m in candidates if m.matches(key)), None)


INTRO = """\
# Metrics

Every run writes its scalars twice, in `train.output_dir`: one JSON line per step in
`metrics.jsonl` (`step` and each scalar of that step) and the same scalars in TensorBoard.
Watch them live with `tensorboard --logdir OUTPUT_DIR/tensorboard` (its TEXT tab shows sampled
responses with their scores) or `tail -f OUTPUT_DIR/metrics.jsonl`; read them afterwards with
`pandas.read_json("OUTPUT_DIR/metrics.jsonl", lines=True)`. The progress bar shows a few of them.
A key is missing from a line when that step did not measure it: held-out evaluation runs only on
some steps, a value head's statistics exist only in a PPO run with one.

What to watch first: in RL, `env/reward_mean` rising, `eval/reward_mean` (the held-out curve)
rising with it, and `objective/kl` near the KL target ([KL control](kl-control.md));
`ppo/policy/approxkl` and `ppo/policy/clipfrac` say how far each update moves the policy. For a
reward model, `eval/accuracy`; for SFT, `eval/loss`; for DPO, `eval/rewards/accuracies`.

A key in braces is a pattern: one key per reward source, per name a reward function logs, per loss
term. The stages the tables name:

"""

OUTRO = """
This page is generated from `hydrappo/train/metric_keys.py`, where every logged key is declared:
after changing that table, run `python -m hydrappo.train.metric_keys > docs/metrics.md`.
`tests/train/test_metric_keys.py` fails when the code logs a key the table does not hold, or when
this page is not the table's.
"""


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown() -> str:
    """docs/metrics.md: the intro, the stages, then a table per section."""
    lines = [INTRO.rstrip("\n"), ""]
    lines += [f"- `{stage}`: {cell(what)}" for stage, what in STAGES.items()]
    for section in SECTIONS:
        lines += [
            "",
            f"## {section.title}",
            "",
            section.text,
            "",
            "| key | logged by | meaning |",
            "| --- | --- | --- |",
        ]
        for metric in section.metrics:
            lines.append(f"| `{metric.key}` | {', '.join(metric.stages)} | {cell(metric.meaning)} |")
    return "\n".join(lines) + "\n" + OUTRO


if __name__ == "__main__":
    print(markdown(), end="")
