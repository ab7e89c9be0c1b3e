"""What the supervised stages (reward model, SFT, DPO) share beyond the harness: epochs of
shuffled batches that resume exactly, the step count, the frozen-trunk cache, and the best held-out
evaluation kept for the end (BestEvaluation)."""

from __future__ import annotations

import math

import torch

from ..data import pack_sequences
from ..errors import UsageError
from ..model import HydraModel
from .harness import TrainingLoop
from .run_log import as_float


def total_steps_of(train, num_examples: int) -> int:
    """Optimizer steps of a stage: `max_steps`, or `epochs` passes of ceil(examples / batch)."""
    per_epoch = math.ceil(num_examples / train.batch_size)
    return train.max_steps if train.max_steps > 0 else train.epochs * per_epoch


def batches(num_examples: int, batch_size: int, generator: torch.Generator | None = None) -> list[list[int]]:
    """Index batches of one pass (shuffled when a generator is given; the last may be smaller)."""
    order = (
        torch.randperm(num_examples, generator=generator).tolist()
        if generator is not None
        else list(range(num_examples))
    )
    return [order[i : i + batch_size] for i in range(0, num_examples, batch_size)]


def weighted_means(dist, stats: dict, weight: float) -> dict:
    """Statistics that each process computed as means over its share of a batch (`weight`
    items), as means over the whole batch: each process's weighted by its share. With one
    process, `stats` as they are."""
    if not dist.enabled:
        return stats
    totals, weights = {}, {}
    for part, part_weight in dist.gather_objects(
        ({key: as_float(value) for key, value in stats.items()}, float(weight))
    ):
        for key, value in part.items():
            totals[key] = totals.get(key, 0.0) + value * part_weight
            weights[key] = weights.get(key, 0.0) + part_weight
    return {key: totals[key] / weights[key] for key in totals if weights[key] > 0}


class SupervisedStage(TrainingLoop):
    """What the reward and SFT loops share around the harness: `train()`, which fills the split
    cache (see SplitCache.fill) before running the steps. A stage has `harness`, `split_cache`,
    `tokenizer`, `config`, `total_steps` and `cache_examples()`."""

    more_steps_option = "--max_steps (or --epochs)"

    def train(self, resume=None) -> list[dict]:
        """Each process of a distributed run caches every example: its shares of later batches
        are other examples."""
        with self.harness.dist.phase("caching the frozen trunk's outputs"):
            self.split_cache.fill(
                self.cache_examples(),
                self.tokenizer.pad_token_id,
                self.config.train.eval_batch_size,
                progress=self.config.train.progress_bar and self.harness.dist.is_main,
            )
        return self.harness.run(self, self.total_steps, resume)


class EpochBatches:
    """Shuffled batches, epoch after epoch, from one seeded generator. The state is the
    generator's state at the start of the current epoch and the position in it, so a run
    resumed from `state_dict()` draws exactly the batches an uninterrupted run draws."""

    def __init__(self, num_examples: int, batch_size: int, seed: int):
        self.num_examples, self.batch_size = num_examples, batch_size
        self.generator = torch.Generator().manual_seed(seed)
        self.epoch = 0
        self._start_epoch()

    def _start_epoch(self) -> None:
        self.epoch_start_state = self.generator.get_state()
        self.epoch_batches = batches(self.num_examples, self.batch_size, self.generator)
        self.position = 0

    def next(self) -> tuple[list[int], bool]:
        """The next batch of indices, and whether it is the last one of its epoch."""
        if self.position == len(self.epoch_batches):
            self.epoch += 1
            self._start_epoch()
        batch = self.epoch_batches[self.position]
        self.position += 1
        return batch, self.position == len(self.epoch_batches)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "generator": self.epoch_start_state}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        self._start_epoch()
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


class SplitCache:
    """The frozen bottom layers' output per example, kept for its real tokens only.

    The bottom of the trunk is frozen and the data is fixed, so an example's split hidden
    state never changes: with the cache on, it is computed once and later epochs,
    evaluations and the score statistics run only the top layers. Off, every batch runs
    the bottom (without gradients)."""

    def __init__(self, hydra: HydraModel, enabled: bool):
        self.hydra, self.enabled = hydra, enabled
        self.rows: dict = {}

    def fill(self, examples: dict, pad_token_id: int, chunk_size: int, progress: bool = False) -> None:
        """Compute every example's split hidden state now ({key: (prompt ids, response ids)}),
        in key order and fixed chunks. A row's numbers depend (in the last bits) on the batch
        it was computed in, so filling the cache the same way every time makes its contents
        independent of how training happened to batch the examples: a resumed run then
        computes exactly what an uninterrupted one did. An example whose tokens begin another's
        (the rows of a conversation, one per assistant turn) is not computed: its states are the
        first ones of the longer example's (causal attention: a token's state depends only on the
        tokens before it), read as a view. `progress`: a bar of examples cached (on a CPU,
        hundreds of long examples take minutes before the first step)."""
        if not self.enabled:
            return
        from tqdm.auto import tqdm

        keys = sorted(key for key in examples if key not in self.rows)
        tokens = {key: (*examples[key][0], *examples[key][1]) for key in keys}
        covering = covering_examples(tokens)
        computed = [key for key in keys if covering[key] == key]
        with tqdm(total=len(keys), desc="caching the frozen trunk", unit="example", disable=not progress) as bar:
            for start in range(0, len(computed), chunk_size):
                chunk = computed[start : start + chunk_size]
                input_ids, attention_mask, _, _ = pack_sequences(
                    [examples[key][0] for key in chunk], [examples[key][1] for key in chunk], pad_token_id
                )
                self(chunk, input_ids.to(self.hydra.device), attention_mask.to(self.hydra.device))
                bar.update(len(chunk))
            for key in keys:
                if covering[key] != key:
                    self.rows[key] = self.rows[covering[key]][: len(tokens[key])]
                    bar.update(1)

    def __call__(self, keys: list | None, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Split hidden states (B, T, H) of a batch; `keys` name its rows (None: not cached)."""
        real = attention_mask.bool()
        if keys is None:
            return self.hydra.split_hidden_states(input_ids, attention_mask)
        if self.enabled and all(key in self.rows for key in keys):
            first = self.rows[keys[0]]
            split = first.new_zeros((*input_ids.shape, first.shape[-1]))
            split[real] = torch.cat([self.rows[key] for key in keys])
            return split
        split = self.hydra.split_hidden_states(input_ids, attention_mask)
        if self.enabled:
            for row, key in enumerate(keys):
                self.rows[key] = split[row][real[row]].clone()
        return split


def covering_examples(tokens: dict) -> dict:
    """{key: the key of an example whose tokens begin with this one's (itself when none does)}.
    In lexicographic order the sequences that begin with A follow A directly, so each sequence
    is covered by whatever covers the next one, when the next one begins with it."""
    order = sorted(tokens, key=tokens.__getitem__)
    covering = {}
    for index in range(len(order) - 1, -1, -1):
        key = order[index]
        if index + 1 < len(order):
            following = order[index + 1]
            if tokens[following][: len(tokens[key])] == tokens[key]:
                covering[key] = covering[following]
                continue
        covering[key] = key
    return covering


class BestEvaluation:
    """Hugging Face Trainer's load_best_model_at_end for a preference stage: the trained weights at the
    held-out evaluation with the best `metric` (kept on the CPU, a copy of what trains: the band, the branch
    or the adapters), restored at the end, before the final checkpoint is written. Kept in the checkpoints,
    so a resumed run keeps the best of the evaluations before it too."""

    def __init__(self, metric: str, greater_is_better: bool | None = None):
        self.metric = metric if metric.startswith("eval/") else f"eval/{metric}"
        self.greater = not self.metric.endswith("loss") if greater_is_better is None else greater_is_better
        self.step: int | None = None
        self.value: float | None = None
        self.stats: dict = {}
        self.weights: dict[str, torch.Tensor] = {}

    @classmethod
    def of(cls, train, has_held_out: bool) -> BestEvaluation | None:
        """The stage's, from train.load_best_model_at_end and its metric; None when off."""
        if not train.load_best_model_at_end:
            return None
        if not has_held_out:
            raise UsageError(
                "train.load_best_model_at_end keeps the best held-out evaluation, and this run holds out no pairs: "
                "set data.eval_fraction > 0 (or data.eval_file), or leave load_best_model_at_end off."
            )
        return cls(train.metric_for_best_model, train.greater_is_better)

    def offer(self, step: int, stats: dict, module: torch.nn.Module) -> None:
        """An evaluation's statistics: kept, with a copy of `module`'s trainable weights, when they are the best."""
        if self.metric not in stats:
            known = ", ".join(sorted(key for key in stats if key.startswith("eval/")))
            raise UsageError(
                f"train.metric_for_best_model {self.metric!r} is not among the held-out statistics ({known}); "
                "name one of them."
            )
        value = as_float(stats[self.metric])
        if self.value is not None and not (value > self.value if self.greater else value < self.value):
            return
        self.step, self.value = step, value
        self.stats = {key: as_float(v) for key, v in stats.items() if key.startswith("eval/")}
        self.weights = {
            name: p.detach().to("cpu", copy=True) for name, p in module.named_parameters() if p.requires_grad
        }

    def restore(self, module: torch.nn.Module) -> bool:
        """`module`'s trainable weights set to the best evaluation's; False when there was none."""
        if not self.weights:
            return False
        with torch.no_grad():
            for name, p in module.named_parameters():
                if name in self.weights:
                    p.copy_(self.weights[name].to(p.device))
        return True

    def state_dict(self) -> dict:
        kept = {"step": self.step, "value": self.value, "metric": self.metric, "stats": self.stats}
        return {"best_evaluation": kept, "best_evaluation_weights": dict(self.weights)}

    def load_state_dict(self, state: dict) -> None:
        kept = state.get("best_evaluation") or {}
        if kept.get("metric") == self.metric:  # (a run resumed with another metric starts its best anew)
            self.step, self.value, self.stats = kept["step"], kept["value"], kept["stats"]
            self.weights = dict(state.get("best_evaluation_weights") or {})
