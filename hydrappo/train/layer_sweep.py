"""`hydrappo sweep-layers CONFIG.yaml`: the one-layer sweep. Which band to train, measured instead
of guessed: each candidate layer i trains alone (the band i:i+1) for a few steps of the run's own
RL (its algorithm, learning rate, reward and data), from the same start with the same seed, and
is scored by the run's own held-out evaluation; the layers are ranked by held-out gain per step,
and the best window of W consecutive layers is proposed as model.trainable_layers. RL's gains
concentrate mid-stack, and a one-layer sweep run once ranks layers stably enough to fix the
choice (Zhang et al. 2026, "Is One Layer Enough?", arXiv 2607.01232).

    hydrappo sweep-layers CONFIG.yaml [--layers 1:30 | 0.1:0.9] [--steps K] [--window W]
                          [--seed S] [--metric eval/reward_mean] [--output_dir D] [--option value ...]
    hydrappo sweep-layers CONFIG.yaml --seed 1 --compare D0          this sweep against another: rho
    hydrappo sweep-layers --compare D0/layers.jsonl D1/layers.jsonl  two finished sweeps: rho

What is shared between layers: the inputs read and checked once, the model loaded once (into CPU
memory; each layer trains a fresh copy of it on the device), the baseline evaluation (step 0 is
the same model for every layer, so it is evaluated once), and the first step's sampled answers (the
same for every layer: same model, same seed, same prompts; SharedFirstRollout). What is not: each
layer's steps run its own frozen bottom (the layers below i), because the split differs from layer
to layer, and its later steps sample from its own updated policy.

D/layers.jsonl holds the sweep: a first line naming what it measures (the config, the steps), the
baseline evaluation, then one line per layer as it finishes (flushed and synced), so an
interrupted sweep, run again with the same command, skips the layers already done. A folder that
holds a sweep of another config is refused. The ranking and the band are computed from that file
(rank_layers, best_window: algo/ranking.py), so they can be read again with another --metric or
--window at no cost (every layer done: nothing trains).
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import json
import math
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..algo.ranking import best_window, rank_layers, spearman_rho
from ..config.command_line import argument, command_parser, options_from
from ..console import launcher_process, report
from ..errors import UsageError, plain_write_errors, shortened
from ..model.band import BandSyntaxError, band_as_fractions, is_fraction, parse_band, resolve_band
from ..storage.rundir import LOCK_NAME, lock_output_dir, release_output_dir

RESULTS = "layers.jsonl"
FORMAT = 1  # of layers.jsonl's lines
DEFAULT_STEPS = 4
DEFAULT_METRIC = "eval/reward_mean"
# Options that do not change what a layer's steps measure: a sweep resumed with another value of one
# of them goes on (the layer choice is the sweep's own; the rest are a run's files and logs).
NOT_MEASURED = {
    ("model", "num_layers_unfrozen"),
    ("model", "trainable_layers"),
    ("train", "output_dir"),
    ("train", "overwrite_output_dir"),
    ("train", "progress_bar"),
    ("train", "save_every"),
    ("train", "keep_last"),
    ("train", "log_samples_every"),
    ("train", "eval_every"),
}


class SweepError(UsageError):
    """The sweep cannot run as asked; the message says what to give instead."""


# ---------------------------------------------------------------------------- the candidates


def candidate_layers(text: str | None, num_layers: int) -> list[int]:
    """The layers `--layers` names, each trained alone: "START:END" as layer indices (END exclusive,
    "1:30"; "START:" to the top) or as fractions of the depth ("0.1:0.9", resolved per model as
    model.trainable_layers is: model/band.py). Default: every layer that can train alone, 1..L-1
    (layer 0 cannot: the hydra keeps at least one frozen layer below what trains)."""
    if text is None:
        return list(range(1, num_layers))
    try:
        band = parse_band(text)
    except BandSyntaxError as error:
        raise SweepError(f"--layers {text!r} {error.rule}: {error.fix}.") from None
    top = f"this model has {num_layers} decoder layers (0..{num_layers - 1})"
    if is_fraction(band):
        start, end = band
        if start >= 1 or (end is not None and (end > 1 or end <= start)):
            raise SweepError(
                f"--layers {text!r} is no range of the depth: fractions lie in 0..1 with START below END "
                "(e.g. '0.1:0.9', or '0.3:' to the top)."
            )
        first, last = resolve_band(band, num_layers)
        return list(range(first, last))
    start, end = band
    end = num_layers if end is None else end
    if start < 1:
        raise SweepError(
            f"--layers {text!r} starts at layer 0, which cannot train alone: the hydra keeps at least one frozen "
            f"layer below what trains; start at 1 (e.g. '1:{num_layers}')."
        )
    if end > num_layers or start >= num_layers:
        raise SweepError(f"--layers {text!r} runs past the top: {top}; end at {num_layers} or below.")
    if end <= start:
        raise SweepError(f"--layers {text!r} is empty (END must be above START), e.g. '{start}:{start + 4}'.")
    return list(range(start, end))


def configured_width(model, num_layers: int) -> int:
    """How many layers the config itself trains: its band's width, or its top N (4 when that is
    every layer or none)."""
    if model.trainable_layers is not None:
        start, end = resolve_band(parse_band(model.trainable_layers), num_layers)
        return end - start
    n = model.num_layers_unfrozen
    return n if 0 < n < num_layers else 4


def describe_band(start: int, end: int, num_layers: int) -> str:
    """ "13:17 (0.43:0.57 of 30 layers)": the band as indices and as the fractions that name it on any model."""
    return f"{start}:{end} ({band_as_fractions(start, end, num_layers)} of {num_layers} layers)"


# ---------------------------------------------------------------------------- the results file


def _measured_options(config_dict: dict) -> dict:
    return {
        section: {k: v for k, v in options.items() if (section, k) not in NOT_MEASURED}
        for section, options in config_dict.items()
    }


def _plain(value):
    return json.loads(json.dumps(value, default=str))  # what a JSON line holds (a path as text)


@dataclass
class SweepResults:
    """What D/layers.jsonl holds: what the sweep measures (`header`), the baseline's eval/* statistics
    and one row per layer done, {layer: {"layer", "eval", "train", "time_s"}}."""

    path: Path
    header: dict
    baseline: dict | None = None
    rows: dict = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return int(self.header["steps"])

    @property
    def num_layers(self) -> int:
        return int(self.header["num_layers"])

    def gains(self, metric: str = DEFAULT_METRIC) -> dict[int, float]:
        """{layer: held-out gain per step}: (the metric after K steps - at step 0) / K."""
        if self.baseline is None or not self.rows:
            return {}
        known = set(self.baseline).intersection(*(row["eval"] for row in self.rows.values()))
        if metric not in known:
            names = ", ".join(sorted(name for name in known if not name.startswith("time/")))
            raise SweepError(f"--metric {metric!r} is not in {self.path}'s evaluations; it holds {names}.")
        before = self.baseline[metric]
        return {layer: (row["eval"][metric] - before) / self.steps for layer, row in sorted(self.rows.items())}

    def append(self, line: dict) -> None:
        """One line, flushed and synced: a sweep killed after it keeps it."""
        with plain_write_errors(
            "a line of the sweep's results", self.path, "the lines written before it are intact", "rerun to resume"
        ):
            with self.path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(_plain(line)) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
        self._take(line)

    def _take(self, line: dict) -> None:
        if "baseline" in line:
            self.baseline = line["baseline"]
        elif "layer" in line:
            self.rows[int(line["layer"])] = line

    @classmethod
    def read(cls, path: str | os.PathLike, option: str = "--compare", repair: bool = False) -> SweepResults:
        """The sweep in a layers.jsonl file (or the folder that holds one). A last line cut short
        (a sweep killed while writing it) is skipped, and with `repair` cut off the file, so that
        the next line starts clean; nothing before it is touched."""
        path = Path(path)
        if path.is_dir():
            path = path / RESULTS
        if not path.is_file():
            raise SweepError(f"{option} {str(path)!r}: no such file; give a sweep's {RESULTS} (or its folder).")
        data = path.read_bytes()
        lines, good = data.split(b"\n"), 0
        parsed = []
        for number, raw in enumerate(lines):
            if not raw.strip():
                good += len(raw) + 1
                continue
            try:
                line = json.loads(raw)
            except ValueError:
                if number == len(lines) - 1:  # the last line, with no newline: cut short
                    break
                raise SweepError(
                    f"{option} {str(path)!r}: line {number + 1} is not JSON; it is no sweep's {RESULTS} "
                    "(a sweep writes whole lines only)."
                ) from None
            parsed.append(line)
            good += len(raw) + 1
        if not parsed or "sweep" not in parsed[0] or parsed[0]["sweep"].get("format") != FORMAT:
            raise SweepError(
                f"{option} {str(path)!r} is not a layer sweep's results (its first line names no sweep of format "
                f"{FORMAT}); give the {RESULTS} that hydrappo sweep-layers wrote."
            )
        if repair and good < len(data):
            os.truncate(path, min(good, len(data)))
        results = cls(path, parsed[0]["sweep"])
        for line in parsed[1:]:
            results._take(line)
        return results


def claim_results(output_dir: Path, header: dict) -> SweepResults:
    """The results file of a sweep in `output_dir`: created with its header, or (the same sweep run
    again) read to resume. Another sweep's folder, or one that holds other files, is refused."""
    path = output_dir / RESULTS
    if path.exists():
        results = SweepResults.read(path, "--output_dir", repair=True)
        differences = _differences(results.header, header)
        if differences:
            shown = "; ".join(differences[:4]) + (f"; and {len(differences) - 4} more" if len(differences) > 4 else "")
            raise SweepError(
                f"--output_dir {str(output_dir)!r} holds a sweep of another setting ({shown}); its results stand for "
                "that one. Choose another --output_dir, or run that sweep's setting again to resume it."
            )
        return results
    if output_dir.is_dir() and any(entry.name != LOCK_NAME for entry in output_dir.iterdir()):
        raise SweepError(
            f"--output_dir {str(output_dir)!r} holds files and no {RESULTS}: it is no sweep's folder. Choose an "
            "empty or new folder."
        )
    with plain_write_errors("the sweep's results file", path, "nothing was written", "choose another --output_dir"):
        output_dir.mkdir(parents=True, exist_ok=True)
        results = SweepResults(path, header)
        results.append({"sweep": header})
    return results


def _differences(there: dict, here: dict) -> list[str]:
    """`option there -> here` for each measured option two sweeps set differently."""
    found = []
    if there.get("steps") != here.get("steps"):
        found.append(f"--steps {there.get('steps')} there, {here.get('steps')} here")
    a, b = there.get("config", {}), here.get("config", {})
    for section in sorted(set(a) | set(b)):
        for option in sorted(set(a.get(section, {})) | set(b.get(section, {}))):
            old, new = a.get(section, {}).get(option), b.get(section, {}).get(option)
            if old != new:
                found.append(f"{section}.{option} {shortened(old, 40)} there, {shortened(new, 40)} here")
    return found


# ---------------------------------------------------------------------------- reading a sweep


def ranking_text(results: SweepResults, metric: str, window: int | None) -> str:
    """The layers ranked by held-out gain per step, and the band the best window proposes."""
    gains = results.gains(metric)
    if not gains:
        return "no layer done yet."
    total = results.num_layers
    before = results.baseline[metric]
    lines = [
        f"layers ranked by held-out gain per step ({metric}, {before:.4f} at step 0, {_count(results.steps, 'step')} each):"
    ]
    lines.append("  rank  layer  depth  after K steps  gain per step")
    for place, layer in enumerate(rank_layers(gains), 1):
        after = results.rows[layer]["eval"][metric]
        lines.append(f"  {place:>4}  {layer:>5}  {layer / total:5.2f}  {after:13.4f}  {gains[layer]:+13.5f}")
    if len(gains) > 1 and len(set(gains.values())) == 1:
        lines.append(
            "every layer gained the same: this ranking orders nothing (the evaluation did not tell the layers "
            "apart; more steps, more held-out prompts, or a start that already scores above 0 can)"
        )
    if window is not None:
        try:
            start, end, summed = best_window(gains, window)
        except ValueError:
            lines.append(f"no {window} consecutive layers are done yet: no band to propose.")
        else:
            lines.append(
                f"proposed band, the best {_count(window, 'consecutive layer')} (summed gain per step {summed:+.5f}): "
                f"{describe_band(start, end, total)}"
            )
            lines.append(f'  model.trainable_layers: "{band_as_fractions(start, end, total)}"   (or "{start}:{end}")')
    return "\n".join(lines)


def comparison_text(a: SweepResults, b: SweepResults, metric: str) -> str:
    """Spearman's rho between two sweeps' rankings over the layers both measured."""
    ga, gb = a.gains(metric), b.gains(metric)
    common = sorted(set(ga) & set(gb))
    if len(common) < 2:
        return f"rank correlation: the two sweeps share {len(common)} measured layer(s); at least 2 are needed."
    rho = spearman_rho([ga[layer] for layer in common], [gb[layer] for layer in common])
    seeds = [r.header.get("config", {}).get("train", {}).get("seed") for r in (a, b)]
    value = "undefined (one sweep's gains are all equal)" if math.isnan(rho) else f"{rho:+.3f}"
    best = [rank_layers({layer: g[layer] for layer in common})[0] for g in (ga, gb)]
    return (
        f"Spearman's rho between the two sweeps' rankings over their {len(common)} common layers ({metric}): "
        f"{value}\n  {a.path} (seed {seeds[0]}): best layer {best[0]}\n  {b.path} (seed {seeds[1]}): best layer {best[1]}"
    )


# ---------------------------------------------------------------------------- running a sweep


@dataclass
class Sweep:
    """A sweep, checked: the run's config, the candidates, K steps each, the results file."""

    config: object
    inputs: object
    layers: list[int]
    steps: int
    window: int
    metric: str
    num_layers: int
    results: SweepResults

    @property
    def todo(self) -> list[int]:
        return [layer for layer in self.layers if layer not in self.results.rows]


def layer_config(config, layer: int):
    """The run's config with only layer `layer` training: the band layer:layer+1, and neither the
    output embeddings nor the final norm (a one-layer sweep measures the layer alone)."""
    config = copy.deepcopy(config)
    config.model.trainable_layers = f"{layer}:{layer + 1}"
    # (the option's default: a band beside a top N given is refused as two answers to one question)
    config.model.num_layers_unfrozen = next(
        option.default for option in dataclasses.fields(config.model) if option.name == "num_layers_unfrozen"
    )
    config.model.train_lm_head = config.model.train_final_norm = False
    return config


def check_metric(metric: str, stats: dict, path: Path) -> None:
    """Refuse a --metric the run's evaluation does not log, before any layer trains."""
    if metric not in stats:
        names = ", ".join(sorted(name for name in stats if not name.startswith("time/")))
        raise SweepError(f"--metric {metric!r} is not among the held-out statistics of this run ({path}): {names}.")


def plan_text(sweep: Sweep) -> str:
    config, todo, k = sweep.config, sweep.todo, sweep.steps
    done = len(sweep.layers) - len(todo)
    evaluations = len(todo) + (sweep.results.baseline is None)
    prompts = "its held-out prompts"
    if config.task.enabled:
        prompts = f"its {config.task.task_eval_size} held-out task items"
    if not todo and sweep.results.baseline is not None:
        return f"every one of the {len(sweep.layers)} layers is done already in {sweep.results.path}: nothing trains"
    lines = [
        f"one-layer sweep of {config.model.name_or_path} ({sweep.num_layers} decoder layers): layers "
        f"{sweep.layers[0]}..{sweep.layers[-1]} ({len(sweep.layers)}), each alone for {_count(k, 'step')} of "
        f"{config.ppo.advantage_estimator} at lr {config.ppo.learning_rate:g}, seed {config.train.seed}",
        f"cost: {_count(len(todo), 'layer')} x {_count(k, 'step')} = {_count(len(todo) * k, 'step')} and "
        f"{_count(evaluations, 'evaluation')} of {prompts}"
        + (f" ({done} layers done already, skipped)" if done else ""),
        "shared: the model load, the baseline evaluation and the first step's sampled answers; each layer's steps "
        "run its own frozen bottom (the split moves with the layer)",
    ]
    if sweep.config.model.train_lm_head or sweep.config.model.train_final_norm:
        lines.append("the config trains the output head or final norm: the sweep does not (each layer alone)")
    lines.append(f"results: {sweep.results.path}")
    return "\n".join(lines)


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}" + ("" if n == 1 else "s")


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def estimate_text(step_seconds: list[float], eval_seconds: float, layer: int, layers_left: int) -> str:
    """The time the other layers will take, from the first layer's steps: their median (the first
    step of a process also pays one-time warm-ups) and its evaluation. The first layer is the lowest,
    whose update backpropagates through the most layers, and the only one that samples its first step's
    answers (SharedFirstRollout), so the estimate leans high."""
    step = statistics.median(step_seconds[1:] or step_seconds)
    per_layer = len(step_seconds) * step + eval_seconds
    left = per_layer * layers_left
    return (
        f"estimate: about {_duration(left)} more for the other {_count(layers_left, 'layer')} "
        f"({len(step_seconds)} x {step:.1f} s, layer {layer}'s median step, + {eval_seconds:.1f} s of evaluation "
        "each; a higher layer's step costs less, its update backpropagating through fewer layers)"
    )


class SharedFirstRollout:
    """The first step's sampled answers, sampled once for the whole sweep. Every layer starts from
    the same model with the same seed and draws the same prompts, so its first step would sample the
    very same tokens: the first layer samples them, and each later layer takes a copy together with
    the random state that followed the sampling, so its steps go on exactly as if it had sampled them
    itself. The frozen bottom's recorded output is not handed on (the split moves with the layer):
    the experience pass recomputes it. Episodes of an agent (environments, caches) are not shared."""

    def __init__(self):
        self.prompt_ids = self.responses = self.random_after = None
        self.reused = 0

    def attach(self, step) -> None:
        """Serve `step`'s first call of generate (a PPOStep's rollout sampling); later calls sample."""
        if step.agent is not None:
            return
        sample = step.generate

        def first_generate(prompt_ids, indices=None):
            from ..storage.checkpoint import rng_state, set_rng_state

            del step.generate  # (this instance attribute goes: later steps sample as usual)
            if self.responses is not None and prompt_ids == self.prompt_ids:
                set_rng_state(self.random_after)
                self.reused += 1
                return copy.deepcopy(self.responses)
            responses = sample(prompt_ids, indices)
            self.prompt_ids, self.random_after = copy.deepcopy(prompt_ids), rng_state()
            self.responses = copy.deepcopy(dataclasses.replace(responses, split_hidden=None))
            return responses

        step.generate = first_generate


def run_sweep(sweep: Sweep, *, say=report) -> SweepResults:
    """Train each layer not done yet for K steps, evaluate it, write its line; the baseline first
    when the file has none. The model loads once; every layer starts from a copy of it."""
    if not sweep.todo and sweep.results.baseline is not None:
        return sweep.results
    import torch

    from ..storage.checkpoint import seed_everything
    from ..storage.models import build_hydra, load_model_and_tokenizer, resolve_dtype
    from .ppo import PPOTrainer
    from ..storage.models import pick_device

    config = sweep.config
    device = pick_device(config.train.device)
    seed_everything(config.train.seed)  # a random-init model is built from the seed, as a run builds it
    pristine, tokenizer = load_model_and_tokenizer(
        config.model, device="cpu", dtype=resolve_dtype(config.model.dtype, device)
    )
    lora = config.lora if config.lora.lora_r > 0 else None
    todo = sweep.todo or [sweep.layers[0]]  # (only the baseline missing: one trainer evaluates it)
    sweep_start, first_layer_steps = time.perf_counter(), []
    first_rollout = SharedFirstRollout()
    for number, layer in enumerate(todo):
        one = layer_config(config, layer)
        seed_everything(config.train.seed)  # every layer's value head starts alike
        hydra, _ = build_hydra(
            one.model, lora, device=device, value_head=one.ppo.uses_critic, loaded=(copy.deepcopy(pristine), tokenizer)
        )
        trainer = PPOTrainer(one, hydra=hydra, tokenizer=tokenizer, inputs=copy.copy(sweep.inputs))
        first_rollout.attach(trainer.ppo_step)
        if sweep.results.baseline is None:
            # Evaluated as the layers' evaluations are, at step K: sampled answers then draw the same
            # random numbers (evaluation/heldout.py seeds each batch by its step), so an unchanged policy gains 0.
            stats = trainer.evaluate(sweep.steps)
            sweep.results.append({"baseline": stats})
            check_metric(sweep.metric, stats, sweep.results.path)
            say(
                f"baseline (step 0): {sweep.metric} {stats.get(sweep.metric, math.nan):.4f} ({stats['time/eval']:.1f} s)"
            )
            if not sweep.todo:
                break
        started, last = time.perf_counter(), {}
        for step in range(1, sweep.steps + 1):
            step_start = time.perf_counter()
            last, _ = trainer.run_step_backing_off()
            trainer.harness.step += 1
            seconds = time.perf_counter() - step_start
            reward = last.get("env/reward_mean", math.nan)
            say(f"  layer {layer} step {step}/{sweep.steps}: reward {reward:.4f} ({seconds:.1f} s)")
            if number == 0:
                first_layer_steps.append(seconds)
        train_s = time.perf_counter() - started
        eval_stats = trainer.evaluate(sweep.steps)
        row = {
            "layer": layer,
            "band": f"{layer}:{layer + 1}",
            "eval": eval_stats,
            "train": {k: v for k, v in last.items() if k.startswith(("env/", "objective/", "ppo/loss/", "loss/"))},
            "time_s": {"steps": train_s, "eval": eval_stats["time/eval"]},
        }
        sweep.results.append(row)
        gain = (
            eval_stats.get(sweep.metric, math.nan) - sweep.results.baseline.get(sweep.metric, math.nan)
        ) / sweep.steps
        say(
            f"layer {layer} ({number + 1}/{len(todo)}): {sweep.metric} {eval_stats.get(sweep.metric, math.nan):.4f}, "
            f"gain {gain:+.5f} per step ({train_s:.1f} s of steps, {eval_stats['time/eval']:.1f} s of evaluation)"
        )
        if number == 0 and len(todo) > 1:
            say(estimate_text(first_layer_steps, eval_stats["time/eval"], layer, len(todo) - 1))
        del trainer, hydra
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    shared = f" (the first step's answers sampled once, taken by {_count(first_rollout.reused, 'more layer')})"
    say(f"sweep time: {_duration(time.perf_counter() - sweep_start)}" + (shared if first_rollout.reused else ""))
    return sweep.results


# ---------------------------------------------------------------------------- the command


def _num_layers(model) -> int | None:
    """The decoder layer count the model's config.json (or GGUF metadata) gives, before any weight loads."""
    from ..storage.models import resolve_model_source, source_config

    try:
        directory, gguf = resolve_model_source(model.name_or_path, model.gguf_file, model.revision)
        config = source_config(directory, gguf).get_text_config()
    except (OSError, ValueError):
        return None
    return getattr(config, "num_hidden_layers", None)


@dataclass
class SweepOptions:
    config: str | None = argument(
        None, "the RL run's YAML config (it must hold held-out evaluation)", positional=True, nargs="?"
    )
    layers: str | None = argument(
        None,
        "the candidate layers: indices, END exclusive ('1:30'), or fractions of the depth ('0.1:0.9'); "
        "default every layer that can train alone (1 to the top)",
        metavar="START:END",
    )
    steps: int = argument(DEFAULT_STEPS, f"steps per layer (default {DEFAULT_STEPS})")
    window: int | None = argument(None, "the proposed band's width in layers (default: as many as the config trains)")
    seed: int | None = argument(None, "train.seed for every layer (default the config's)")
    metric: str = argument(DEFAULT_METRIC, f"the held-out statistic to rank by (default {DEFAULT_METRIC})")
    output_dir: str | None = argument(
        None, "the sweep's folder (default: train.output_dir + '-layer-sweep/seed-S'); run again to resume"
    )
    compare: list[str] | None = argument(
        None,
        "Spearman's rho between this sweep's ranking and another's (a layers.jsonl or its folder); without a "
        "config, between two sweeps' files",
        metavar="RESULTS",
    )
    help: bool = argument(False, "show this help message and exit", names=("-h",))


def _parser():
    return command_parser(
        SweepOptions,
        "hydrappo sweep-layers",
        "The one-layer sweep: train each candidate layer alone (the band i:i+1) for a few steps of the "
        "config's own RL, from the same start with the same seed, rank the layers by held-out gain per step and "
        "propose the best window of consecutive layers as model.trainable_layers (arXiv 2607.01232). Options after "
        "the config file that are not the sweep's override it, as for hydrappo train (e.g. --learning_rate 1e-4).",
        add_help=False,
        allow_abbrev=False,
    )


def sweep_layers_command(argv: list[str]) -> int:
    """`hydrappo sweep-layers CONFIG.yaml [options] [--option value ...]`, or `--compare A B`."""
    parser = _parser()
    parsed, overrides = parser.parse_known_args(argv)
    args = options_from(SweepOptions, parsed)
    if args.help or (args.config is None and not args.compare):
        print(parser.format_help())
        return 0 if args.help else 2
    if args.config is None:
        if len(args.compare) != 2 or overrides:
            raise SweepError(
                "--compare without a config compares two finished sweeps: give exactly two files "
                "(hydrappo sweep-layers --compare A/layers.jsonl B/layers.jsonl)."
            )
        a, b = (SweepResults.read(path) for path in args.compare)
        report(comparison_text(a, b, args.metric))
        return 0
    if args.compare and len(args.compare) != 1:
        raise SweepError("--compare after a config compares this sweep with one other: give one file (or folder).")
    other = SweepResults.read(args.compare[0]) if args.compare else None  # (refused before the sweep runs)
    sweep = prepare_sweep(args, overrides)  # (it holds the output folder's lock from its claim)
    try:
        report(plan_text(sweep))
        run_sweep(sweep)
    finally:
        release_output_dir(sweep.results.path.parent)
    report(ranking_text(sweep.results, sweep.metric, sweep.window))
    if other is not None:
        report(comparison_text(sweep.results, other, sweep.metric))
    return 0


def prepare_sweep(args, overrides: list[str]) -> Sweep:
    """Everything that can be refused, refused before any weight loads: the config (an RL run with
    held-out evaluation), the inputs it reads, the candidates against the model's layer count, the
    window, the steps, and the output folder (a sweep of another setting)."""
    from ..config import Config, parse_config, validate
    from ..config.task import has_held_out
    from ..storage.models import fetch_hub_models
    from .api import refuse_without_chat_template
    from .inputs import read_inputs

    if launcher_process()[1] > 1:
        raise SweepError("the sweep runs in one process: start it without torchrun or accelerate launch.")
    if args.steps < 1:
        raise SweepError(f"--steps {args.steps}: give 1 or more steps per layer.")
    if args.window is not None and args.window < 1:
        raise SweepError(f"--window {args.window}: give a band of 1 or more layers.")
    seed = ["--seed", str(args.seed)] if args.seed is not None else []
    config = parse_config(args.config, [*overrides, *seed], Config)
    if not has_held_out(config):
        raise SweepError(
            f"{args.config} has no held-out evaluation, and the sweep ranks layers by held-out gain: give held-out "
            "prompts (data.eval_prompts, or task.task_eval_size > 0 for a task) and leave --eval_prompts on."
        )
    if args.steps > config.train.total_steps:
        raise SweepError(
            f"--steps {args.steps} is past the run's train.total_steps {config.train.total_steps} (its learning-rate "
            "schedule ends there): give fewer steps, or --total_steps as many."
        )
    inputs = read_inputs(config)
    fetch_hub_models(config)
    refuse_without_chat_template(config, inputs)
    num_layers = _num_layers(config.model)
    if num_layers is None:
        raise SweepError(
            f"model.name_or_path={config.model.name_or_path!r}: its config gives no decoder layer count "
            "(num_hidden_layers), which the sweep needs to place its candidates."
        )
    layers = candidate_layers(args.layers, num_layers)
    window = args.window if args.window is not None else min(configured_width(config.model, num_layers), len(layers))
    if window > len(layers):
        raise SweepError(
            f"--window {window} is wider than the {len(layers)} candidate layers ({layers[0]}..{layers[-1]}): "
            f"give --window {len(layers)} or less, or more layers."
        )
    validate(layer_config(config, layers[0]))  # the band with the rest of the config (LoRA in every layer is not)
    output_dir = Path(args.output_dir or f"{config.train.output_dir}-layer-sweep/seed-{config.train.seed}")
    header = {
        "format": FORMAT,
        "steps": args.steps,
        "num_layers": num_layers,
        "config": _plain(_measured_options(config.to_dict())),
    }
    created = lock_output_dir(output_dir, option="--output_dir")  # one sweep at a time in a folder
    try:
        results = claim_results(output_dir, header)
        if results.baseline is not None:
            check_metric(args.metric, results.baseline, results.path)
    except BaseException:
        release_output_dir(output_dir)
        for path in reversed(created):  # a refused folder is left as it was found
            path.rmdir() if path.is_dir() else path.unlink(missing_ok=True)
        raise
    return Sweep(config, inputs, layers, args.steps, window, args.metric, num_layers, results)
