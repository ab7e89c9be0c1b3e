"""Held-out evaluation during RL: the policy's answers to prompts it never trains on, scored
by the run's own reward(s), at step 0 (a baseline before any update), every
`train.eval_every` steps and at the last step. This is the curve users judge an RL run by
(TRL's eval_strategy, verl's test_freq with val_before_train).

Evaluating must not change training: every RNG stream (python, numpy, torch, CUDA) is saved
before and restored after, so a run with evaluation ends with the same weights as one without,
and exact resume is unaffected. Answers are greedy by default (`train.eval_greedy`), which
makes the curve free of sampling noise; sampled answers draw from a seed of their own per
batch. With `train.eval_samples_per_prompt` K > 1 (sampled answers only) every prompt is answered
K times and the statistics are over all K answers: a curve's point then averages K x P answers,
which shrinks its sampling noise by about sqrt(K) (TRL's num_generations_eval, verl's
val_kwargs.n). Under torch.distributed the prompts are dealt in batches to the processes
(ProcessGroup.map_in_order) and each batch is computed as one process would compute it, so
the numbers do not depend on the number of processes.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext

import torch

from ..algo.degeneration import degeneration_flags
from ..data import PromptSet
from ..agent.episodes import summarize
from ..generation.responses import Responses
from ..rewards.context import with_columns
from ..storage.checkpoint import rng_state, set_rng_state


def evaluation_due(step: int, every: int, total_steps: int) -> bool:
    """Step 0 (the baseline), every `every` steps (0: none between) and the last step."""
    return step == 0 or step == total_steps or (every > 0 and step % every == 0)


def held_out_statistics(
    scores: list[float],
    lengths: list[int],
    ended: list[bool],
    degenerate: list[bool],
    parts: dict[str, list[float]] | None = None,
    answers_per_prompt: int = 1,
    solved_parts: tuple[str, ...] = (),
) -> dict:
    """The eval/* scalars of one evaluation, over every answer (`answers_per_prompt` to each
    prompt). `eval/solve_rate` appears where every score is 0 or 1 (a verifiable reward): the
    share of answers that solve their prompt (with one answer each, of prompts solved). `parts`:
    each reward's own scores, logged as its mean under eval/reward/<name>. `solved_parts`: the
    rewards whose full score, 1, means solved (a reasoning-gym task's verifier, which gives partial
    credit below it): the share of their scored answers that solve, eval/solved/<name>."""
    unscored = sum(score != score for score in scores)  # NaN: no reward scored it (TRL's None)
    scores, count = [score for score in scores if score == score] or [0.0], len(scores)
    stats = {
        "eval/reward_mean": statistics.fmean(scores),
        "eval/reward_std": statistics.pstdev(scores) if len(scores) > 1 else 0.0,
        "eval/response_len_mean": statistics.fmean(lengths),
        "eval/missing_eos_frac": 1.0 - sum(ended) / count,
        "eval/degenerate_frac": sum(degenerate) / count,
        "eval/prompts": float(count // answers_per_prompt),
    }
    if answers_per_prompt > 1:
        stats["eval/answers_per_prompt"] = float(answers_per_prompt)
    if all(score in (0.0, 1.0) for score in scores):
        stats["eval/solve_rate"] = sum(scores) / (count - unscored or 1)
    if unscored:
        stats["eval/unscored_frac"] = unscored / count
    for name, values in (parts or {}).items():
        scored = [v for v in values if v == v]  # NaN: an answer this reward did not score
        stats[f"eval/reward/{name}"] = statistics.fmean(scored or [0.0])
        if name in solved_parts:
            stats[f"eval/solved/{name}"] = sum(v >= 1.0 for v in scored) / (len(scored) or 1)
    return stats


def held_out_summary(history: list[dict]) -> str:
    """ ", held-out reward 0.750 (step 0: 0.250), solved 0.750 (0.250)" from a run's records: its
    last evaluation beside the first (the baseline); "" when the run evaluated nothing."""
    evaluated = [record for record in history if "eval/reward_mean" in record]
    if not evaluated:
        return ""
    first, last = evaluated[0], evaluated[-1]
    text = f", held-out reward {last['eval/reward_mean']:.3f}"
    if first is not last:
        text += f" (step {first['step']:.0f}: {first['eval/reward_mean']:.3f})"
    if "eval/solve_rate" in last:
        text += f", solved {last['eval/solve_rate']:.3f}"
        if first is not last and "eval/solve_rate" in first:
            text += f" ({first['eval/solve_rate']:.3f})"
    return text


def answer_and_score(
    prompts: PromptSet, rows: list[int], generate: Callable, score: Callable | None, tokenizer
) -> list[dict]:
    """The one "answer and score" path, of held-out evaluation during RL and of the generate /
    compare commands (evaluation/compare.py): the prompts' `rows` answered by `generate(prompt_ids, rows)` ->
    Responses, scored by `score(rows, prompt_texts, responses)` -> (scores, {source: scores} or None)
    (None: unscored), one dict per answer: prompt, response, score, length, ended, degenerate, each
    source's score (parts) and the episode's statistics (agent)."""
    prompt_ids = [prompts.input_ids[i] for i in rows]
    prompt_texts = [prompts.texts[i] for i in rows]
    responses: Responses = generate(prompt_ids, rows)
    scores, parts = score(rows, prompt_texts, responses) if score is not None else ([None] * len(rows), None)
    episodes = responses.episode_stats
    # An episode's sample is its whole transcript, the chat template's turn markers kept.
    texts = tokenizer.batch_decode(responses.response_ids, skip_special_tokens=episodes is None)
    degenerate = degeneration_flags(responses.response_ids, responses.ended)
    return [
        {
            "prompt": prompt_texts[k],
            "response": texts[k],
            "score": None if scores[k] is None else float(scores[k]),
            "length": len(responses.response_ids[k]),
            "ended": bool(responses.ended[k]),
            "degenerate": degenerate[k],
            "parts": {name: float(values[k]) for name, values in parts.items()} if parts else None,
            "agent": episodes[k] if episodes else None,
        }
        for k in range(len(rows))
    ]


class HeldOutEvaluation:
    """Answers every held-out prompt with the current policy and scores the answers.

    `generate(prompt_ids, greedy)` -> Responses and `score(rows, prompt_texts, responses)` ->
    (scores tensor, {reward name: scores} or None) are the trainer's own, so evaluation
    samples and scores exactly as training does."""

    def __init__(
        self,
        prompts: PromptSet,
        tokenizer,
        *,
        batch_size: int,
        greedy: bool,
        seed: int,
        samples_per_prompt: int = 1,
        solved_parts: tuple[str, ...] = (),
    ):
        self.prompts, self.tokenizer = prompts, tokenizer
        self.solved_parts = solved_parts  # held_out_statistics' eval/solved/<name>
        self.batch_size, self.greedy, self.seed = batch_size, greedy, seed
        self.samples_per_prompt = samples_per_prompt

    def evaluate(
        self,
        step: int,
        dist,
        generate: Callable,
        score: Callable,
        *,
        status: Callable | None = None,
        guard: Callable = nullcontext,
        retry: Callable | None = None,
        take_metrics: Callable | None = None,
    ) -> tuple[dict, list[dict]]:
        """`run`, as a trainer calls it: (eval/* statistics with time/eval, the answer rows with the reward
        sources' columns). `status(text)` shows what runs (None: done); `guard(prompts=, batch=)` is entered
        around each try (the trainer names the phase an out-of-memory error happens in); `retry(error, step)`
        -> True answers again after an error (the trainer's out-of-memory back-off, which may shrink
        batch_size; the random state is restored, so a retry answers as a first try would); `take_metrics()`
        -> (the reward sources' eval/* metrics, their columns per answer)."""
        start = time.perf_counter()
        each = f", {self.samples_per_prompt} answers each" if self.samples_per_prompt > 1 else ""
        status = status or (lambda text: None)
        status(f"step {step}: evaluating {len(self.prompts)} held-out prompts{each}")  # on the bar and in the log
        try:
            while True:
                try:
                    with guard(prompts=len(self.prompts), batch=self.batch_size):
                        stats, samples = self.run(step, dist, generate, score)
                    break
                except Exception as error:
                    if retry is None or not retry(error, step):
                        raise
        finally:
            status(None)
        metrics, extras = take_metrics() if take_metrics is not None else ({}, {})
        return {**stats, **metrics, "time/eval": time.perf_counter() - start}, with_columns(samples, extras)

    def run(self, step: int, dist, generate: Callable, score: Callable) -> tuple[dict, list[dict]]:
        """(eval/* statistics, one {prompt, response, score} row per answer: samples_per_prompt
        consecutive rows for each held-out prompt)."""
        index = [row for row in range(len(self.prompts)) for _ in range(self.samples_per_prompt)]
        # (where the batch starts in `index`, its prompt rows): the start seeds its sampling.
        batches = [(start, index[start : start + self.batch_size]) for start in range(0, len(index), self.batch_size)]
        saved = rng_state()
        try:
            parts = dist.map_in_order(
                lambda batch: self._answer(step, *batch, generate, score),
                batches,
                f"evaluating on the held-out prompts (step {step})",
            )
        finally:
            set_rng_state(saved)
        rows = [row for part in parts for row in part]
        names = rows[0]["parts"].keys() if rows and rows[0]["parts"] else ()
        stats = held_out_statistics(
            [row["score"] for row in rows],
            [row["length"] for row in rows],
            [row["ended"] for row in rows],
            [row["degenerate"] for row in rows],
            {name: [row["parts"][name] for row in rows] for name in names},
            self.samples_per_prompt,
            self.solved_parts,
        )
        if rows and rows[0]["agent"] is not None:  # multi-turn episodes: their tool calls (agent/episodes.py)
            stats |= summarize([row["agent"] for row in rows], "eval/agent/")
        samples = [{"prompt": row["prompt"], "response": row["response"], "score": row["score"]} for row in rows]
        return stats, samples

    def _answer(self, step: int, start: int, rows: list[int], generate: Callable, score: Callable) -> list[dict]:
        if not self.greedy:
            # A stream of its own per batch: the same answers at any number of processes. Seeded
            # by the batch's start, not its first prompt: with several answers per prompt two
            # batches can start at the same prompt (with one answer each the two are the same).
            torch.manual_seed(self.seed * 1_000_003 + step * 10_007 + start)

        def answer(prompt_ids, rows):
            return generate(prompt_ids, self.greedy, rows)

        return answer_and_score(self.prompts, rows, answer, score, self.tokenizer)
