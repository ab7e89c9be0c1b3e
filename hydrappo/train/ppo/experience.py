"""A PPO batch as the update reads it: `Experience` (the sequences, old log-probs, values,
rewards and advantages of this process's rows) and the minibatches of an epoch
(minibatch_plan)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from ...algo.losses import SampledTokens


@dataclass
class Experience:
    """One PPO batch. Sequences are prompt (left-padded to width P) + response
    (right-padded to width R). Per-token tensors are response-aligned, (B, R)."""

    input_ids: torch.Tensor  # (B, P + R)
    attention_mask: torch.Tensor  # (B, P + R)
    action_mask: torch.Tensor  # (B, R), float: 1 on response tokens
    split_hidden: torch.Tensor | None  # (B, P + R, H), the frozen trunk's output
    logprobs: torch.Tensor  # (B, R) under the sampling policy
    ref_logprobs: torch.Tensor | None  # (B, R); None when the reference was not run
    values: torch.Tensor | None  # (B, R); None without a critic
    rewards: torch.Tensor  # (B, R) shaped rewards
    advantages: torch.Tensor  # (B, R)
    returns: torch.Tensor | None  # (B, R) value targets; None without a critic
    prompt_width: int
    # The whole batch this process holds a share of, for minibatches(): every row's weight in the
    # loss's count (algo.losses.aggregation_weights), over the rows of ALL processes in rank order,
    # and the index of this process's first row among them. Minibatches carry neither.
    batch_weights: torch.Tensor | None = None
    first_row: int = 0

    def minibatch(self, index: torch.Tensor) -> Experience:
        """The rows `index` of this process's rows."""
        parts = {}
        for f in fields(self):
            value = getattr(self, f.name)
            parts[f.name] = value[index] if isinstance(value, torch.Tensor) and f.name != "batch_weights" else value
        parts.update(batch_weights=None, first_row=0)
        return Experience(**parts)

    @property
    def whole_batch_size(self) -> int:
        """Rows of the whole batch, over every process."""
        return len(self.batch_weights)

    def minibatches(self, minibatch_rows: torch.Tensor):
        """One epoch of minibatches (minibatch_plan's rows of the WHOLE batch): for each, this
        process's rows of it and the minibatch's loss denominator, its count of tokens (or rows)
        over every process, so that the losses of its parts, however split, add up to its loss."""
        first, end = self.first_row, self.first_row + len(self)
        for rows in minibatch_rows:
            denominator = float(self.batch_weights[rows].sum().clamp(min=1))
            local = rows[(rows >= first) & (rows < end)] - first
            yield self.minibatch(local.to(self.input_ids.device)), denominator

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def split(self, parts: int):
        """`parts` consecutive micro-batches (gradient accumulation)."""
        size = len(self) // parts
        for start in range(0, len(self), size):
            yield self.minibatch(torch.arange(start, min(start + size, len(self)), device=self.input_ids.device))

    def sampled_tokens(self) -> SampledTokens:
        """What the experience pass measured of these rows' tokens, as the loss reads it."""
        return SampledTokens(
            logprobs=self.logprobs,
            advantages=self.advantages,
            action_mask=self.action_mask,
            values=self.values,
            returns=self.returns,
            ref_logprobs=self.ref_logprobs,
        )

    @property
    def logprob_offset(self) -> int:
        """Index in a (B, P+R-1) log-prob row of the first response token's log-prob."""
        return self.prompt_width - 1


def minibatch_plan(batch_size: int, mini_batch_size: int, generator: torch.Generator) -> torch.Tensor:
    """One epoch's minibatches of a batch, (batch_size / mini_batch_size, mini_batch_size): row j
    holds the batch rows of minibatch j. One draw of `generator`.

    Stratified: the batch is cut into mini_batch_size consecutive strata of n = batch_size /
    mini_batch_size rows, and each minibatch takes one row of every stratum (an independent
    shuffle per stratum). Process r of K holds rows [r B/K, (r+1) B/K), which are whole strata,
    so it holds exactly mini_batch_size / K rows of every minibatch (columns r m/K to (r+1) m/K),
    and the minibatches are the same at any number of processes."""
    strata = batch_size // mini_batch_size
    order = torch.rand(mini_batch_size, strata, generator=generator).argsort(-1)
    return (order + strata * torch.arange(mini_batch_size)[:, None]).T.contiguous()
