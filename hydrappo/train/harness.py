"""The plumbing every training loop shares, so that a loop file holds only what differs.

    harness = Harness(config.train, config, max_nonfinite_steps=...)   # seeds, picks device and precision
    ... build the model, the data and the loop ...
    harness.setup_optimizer(params, optimizer_args, total_updates)
    history = harness.run(loop, total_steps, resume=...)

The harness owns: seeding; the device; ONE mixed-precision mechanism (train/precision.py);
the AdamW optimizer and the learning-rate schedule; the non-finite policy (a non-finite
loss or gradient skips the update and is counted, `max_nonfinite_steps` in a row stop the
run naming the last good checkpoint); the logs (train/run_log.py: TensorBoard, metrics.jsonl
and a tqdm bar, with the same conventions for every stage); atomic checkpoints that keep the last K; and
exact resume (weights, optimizer, scheduler, every RNG, the loss scaler, and the loop's own
state, which the loop hands over as a dict); and, under torchrun or accelerate launch, the
process group (train/distributed.py): one device per process, the trainable parameters equal on
every process at the start, their gradients summed at each optimizer step, process 0 writing
the checkpoints, logs and progress bar, and a failure on one process stopping them all.

A loop (PPO, reward, SFT) is a `TrainingLoop` (below): the protocol is declared there, with
defaults for what a loop may leave out.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import torch
import yaml

from ..config import ConfigError, besides_run_tokenizer, input_paths, run_tokenizer_path, startup_inputs, validate
from .. import usercode
from ..errors import HydrappoError, spell
from ..storage.atomic import remove_orphaned_temporaries
from ..storage.checkpoint import (
    latest_checkpoint,
    load_trainable_weights,
    load_training_state,
    refuse_foreign_checkpoint_entries,
    resolve_resume,
    resume_check,
    rng_state,
    save_checkpoint,
    seed_everything,
    set_rng_state,
    trainable_state_dict,
)
from ..storage.models import build_hydra, check_tokenizer_fits, fetch_hub_models
from ..storage.rundir import claim_output_dir, refuse_own_inputs, release_output_dir
from ..storage.run_tokenizer import record_run_tokenizer
from .api import check_processing_class, refuse_without_chat_template, trainer_inputs
from .distributed import ProcessGroup, shard_frozen_trunk
from .inputs import read_inputs
from .interrupt import StopNow, StopOnSignal
from .memory import OutOfMemory, memory_phase
from .optimizers import apply_optimizer_options, load_optimizer_state, make_optimizer
from .precision import MixedPrecision, keep_float32_master_weights, pick_mixed_precision
from .run_log import RunLog

logger = logging.getLogger("hydrappo")

SCHEDULERS = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}


class TrainingError(HydrappoError):
    """Training cannot go on (e.g. too many non-finite steps in a row)."""


def _holds_tensors(value) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, dict):
        return any(_holds_tensors(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_tensors(v) for v in value)
    return False


def enable_activation_checkpointing(model) -> None:
    """transformers renamed gradient checkpointing to activation checkpointing in 5.x."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


class Harness:
    """Seed, device, precision, optimizer, logs, non-finite policy and checkpoints of one run."""

    def __init__(self, run, config, *, max_nonfinite_steps: int = 5):
        self.run_args = run
        self.config = config
        self.max_nonfinite_steps = max_nonfinite_steps
        self.dist, self.device = ProcessGroup.from_environment(run.device, run.dist_timeout_s)
        seed_everything(run.seed)  # the same on every process: a random-init model is built from it
        self.precision = MixedPrecision(pick_mixed_precision(run.mixed_precision, self.device), self.device)
        self.output_dir = Path(run.output_dir)
        self.step = 0
        self.optimizer = self.scheduler = None
        self.params: list[torch.nn.Parameter] = []
        self.nonfinite_in_a_row = 0
        self.nonfinite_total = 0
        self.fp16_overflows = 0
        self.trunk_sharded = False  # train.fsdp_trunk: the frozen layers are sharded over the processes
        self.log: RunLog | None = None  # while run() runs (its bar says what a loop does between steps)
        # A tokenizer given as an object (processing_class): saved in the run folder once it is claimed
        # (storage/run_tokenizer.py), where config.model.tokenizer_name_or_path names it (`prepare`).
        self.given_tokenizer = None

    # ------------------------------------------------------------------ precision and optimizer
    def autocast(self):
        return self.precision.autocast()

    def backward(self, loss: torch.Tensor) -> None:
        self.precision.backward(loss)

    def setup_optimizer(self, params, args, total_updates: int) -> None:
        """AdamW (or `args.optimizer`, train/optimizers.py) over `params` (float32 master weights, see
        precision.keep_float32_master_weights) and the LR schedule, from any options object with learning_rate,
        weight_decay, adam_beta1/2, adam_eps, max_grad_norm, lr_scheduler and warmup_steps."""
        from transformers import get_scheduler

        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise TrainingError(
                "nothing to train: no trainable parameters (check model.num_layers_unfrozen / train_lm_head)."
            )
        keep_float32_master_weights(self.params, self.precision.mode)
        if self.dist.enabled:
            # Every process starts from process 0's weights, then draws its own random numbers
            # (its own samples), as accelerate's set_seed(device_specific=True) does.
            self.dist.broadcast_parameters(self.params)
            seed_everything(self.run_args.seed + self.dist.rank)
        self.max_grad_norm = args.max_grad_norm
        self.optimizer_args = args
        self.optimizer = make_optimizer(self.params, args)  # args.optimizer: adamw | adamw8bit
        self.scheduler = get_scheduler(
            SCHEDULERS[args.lr_scheduler],
            self.optimizer,
            num_warmup_steps=args.warmup_steps,
            num_training_steps=max(1, total_updates),
        )

    def optimizer_step(self, loss_is_finite: bool = True, only=None) -> float | None:
        """Clip and apply the accumulated gradients; returns the gradient norm, or None when
        the update was skipped (a non-finite loss or gradient, or an fp16 overflow). Under
        torch.distributed the gradients are first summed over the processes (each loss was
        divided by the global count), and every process takes or skips the same step.
        `only`: the parameters this step may move (a critic warm-up's value head); the others'
        gradients are dropped first, so the optimizer leaves them as they are, weight decay included."""
        if only is not None:
            self._drop_gradients_except(only)
        loss_is_finite = self.dist.reduce_gradients(self.params, loss_is_finite)
        grad_norm = (
            self.precision.clip_grad_norm_(self.optimizer, self.params, self.max_grad_norm)
            if loss_is_finite
            else math.nan
        )
        try:
            if loss_is_finite and math.isfinite(grad_norm):
                self.precision.step(self.optimizer)
                self.scheduler.step()
                self.nonfinite_in_a_row = 0
                return grad_norm
            if loss_is_finite and self.precision.mode == "fp16":
                # An fp16 gradient overflow is the loss scaler's business: it skips this step
                # and lowers the scale. Not a sign of a diverging run.
                self.precision.step(self.optimizer)
                self.fp16_overflows += 1
                return None
            self._skip_nonfinite_update()
            return None
        finally:
            self.optimizer.zero_grad(set_to_none=True)

    def drop_gradients(self) -> None:
        """Forget the gradients accumulated so far (a minibatch that starts again)."""
        self._drop_gradients_except(())

    def _drop_gradients_except(self, kept) -> None:
        kept = {id(param) for param in kept}
        for param in self.params:
            if id(param) not in kept:
                param.grad = None

    def _skip_nonfinite_update(self) -> None:
        self.nonfinite_in_a_row += 1
        self.nonfinite_total += 1
        logger.warning(
            "non-finite loss or gradient at step %d: update skipped (%d in a row, %d in total)",
            self.step + 1,
            self.nonfinite_in_a_row,
            self.nonfinite_total,
        )
        if self.nonfinite_in_a_row >= self.max_nonfinite_steps:
            latest = latest_checkpoint(self.output_dir)
            raise TrainingError(
                f"{self.nonfinite_in_a_row} non-finite losses or gradients in a row (max_nonfinite_steps="
                f"{self.max_nonfinite_steps}); stopping. The last good checkpoint is "
                f"{latest or 'none (no checkpoint was written yet)'}. Lower the learning rate, check the reward "
                "scale (reward.cliprange_reward) or use float32."
            )

    def optimizer_stats(self, prefix: str = "") -> dict:
        """The learning rate now, and (fp16) the loss scaler's overflows so far."""
        stats = {"lr": self.scheduler.get_last_lr()[0]}
        if self.precision.mode == "fp16":
            stats[f"{prefix}fp16_overflows_total"] = self.fp16_overflows
        return stats

    # ------------------------------------------------------------------ the run
    def run(self, loop, total_steps: int, resume: str | Path | bool | None = None) -> list[dict]:
        """Steps of `loop` until `total_steps`, logging each and checkpointing every
        `save_every` steps and at the end; `resume` = a checkpoint path or True/'latest'.
        A fresh start refuses an output_dir that holds an earlier run (storage/rundir.py);
        SIGINT/SIGTERM stop after the current step, with its checkpoint (train/interrupt.py)."""
        dist, run = self.dist, self.run_args
        try:  # process 0 holds the folder's run lock from its claim to the end of the run
            if resume or self.step == 0:  # (a second call of run() continues in memory)
                with dist.phase("claiming the output folder"):
                    if dist.is_main:  # process 0 writes (and moves an earlier run aside)
                        claim_output_dir(
                            self.output_dir,
                            resume=resume,
                            overwrite=getattr(run, "overwrite_output_dir", False),
                            inputs=input_paths(self.config),
                            read_once=startup_inputs(self.config),
                            records_tokenizer=self.given_tokenizer is not None,
                        )
            if self.given_tokenizer is not None:
                with dist.phase("saving the tokenizer given as processing_class"):
                    if dist.is_main:  # (a resumed run: checked to be the one saved)
                        record_run_tokenizer(self.output_dir, self.given_tokenizer)
            if resume:
                with dist.phase("loading the checkpoint to resume from"):
                    self.load(resolve_resume(resume, self.output_dir, set_aside=dist.is_main), loop)
            with dist.phase("opening the logs"):
                if dist.is_main:
                    self.output_dir.mkdir(parents=True, exist_ok=True)
                    remove_orphaned_temporaries(self.output_dir)  # of a run killed while writing a checkpoint
                    refuse_foreign_checkpoint_entries(self.output_dir)  # before training, not at the save it breaks
                log = RunLog(self.output_dir, self.step, total_steps, loop, run, write=dist.is_main)
        except BaseException:
            release_output_dir(self.output_dir)
            raise
        history = []
        stop = StopOnSignal(lambda: latest_checkpoint(self.output_dir), lambda: f"step {self.step + 1}").install()
        self.log = log
        try:
            if self.step == 0:
                initial = loop.before_training()
                initial, samples = initial if isinstance(initial, tuple) else (initial, None)
                if initial:
                    with dist.phase("logging"):
                        history.append(log.write(0, initial, samples))
                log.bar.restart_clock()  # a step's time on the bar is its own (the baseline has its time/eval)
            while self.step < total_steps:
                try:
                    stats, samples = loop.train_step()
                except OutOfMemory as error:  # the step in flight is not logged; the checkpoints stay
                    raise error.at_step(self.step + 1) if error.step is None else error from None
                self.step += 1
                extra = loop.finish() if self.step == total_steps else None
                with dist.phase(f"logging step {self.step}"):
                    log.scalars(self.step, extra or {})
                    history.append(log.write(self.step, stats, samples))
                # Read once (a signal after this line counts at the next step), the same on every process.
                stopping = dist.largest(stop.requested or 0, "agreeing whether to stop")
                if (run.save_every > 0 and self.step % run.save_every == 0) or self.step == total_steps or stopping:
                    saved = self.save(loop) or self.output_dir / f"checkpoint-{self.step}"  # (None off process 0)
                if stopping and self.step < total_steps:
                    raise stop.stopped(self.step, saved, stopping)
        except StopNow as error:
            raise stop.abandoned(error) from None
        finally:
            stop.uninstall()
            self.log = None
            log.close()
            release_output_dir(self.output_dir)
            usercode.warn_at_end_of_run()  # the Python API: threads a reward function left running
        return history

    # ------------------------------------------------------------------ checkpoints
    def save(self, loop) -> Path | None:
        """Process 0 writes checkpoint-<step> (every process's RNG state in it); returns its path
        there, None on the other processes."""
        rng_states = self.dist.gather_objects(rng_state())
        with self.dist.phase(f"writing checkpoint-{self.step}"):
            if self.dist.is_main:
                with memory_phase("writing a checkpoint", checkpoint=f"checkpoint-{self.step}"):
                    return self._write_checkpoint(loop, rng_states)
        return None

    def _write_checkpoint(self, loop, rng_states: list) -> Path:
        loop_state = loop.state_dict()
        tensors = {key: value for key, value in loop_state.items() if _holds_tensors(value)}
        plain = {key: value for key, value in loop_state.items() if key not in tensors}
        training_state = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng_states[0],
            "rng_per_process": rng_states,
            "grad_scaler": self.precision.state_dict(),
            **tensors,
        }
        return save_checkpoint(
            self.output_dir,
            self.step,
            weights=trainable_state_dict(loop.trained_module),
            training_state=training_state,
            trainer_state={**plain, "nonfinite_total": self.nonfinite_total, "world_size": self.dist.world_size},
            config_yaml=yaml.safe_dump(self.config.to_dict(), sort_keys=False),
            keep_last=self.run_args.keep_last,
            write_extra=loop.write_extra,
        )

    def load(self, path: Path, loop) -> None:
        changes = resume_check(path, self.config)
        if changes and self.dist.is_main:
            logger.warning(
                "%s: options changed, in effect from the next step: %s", spell("resume", path), "; ".join(changes)
            )
        load_trainable_weights(loop.trained_module, path)
        training_state, trainer_state = load_training_state(path)
        load_optimizer_state(self.optimizer, training_state["optimizer"])
        self.scheduler.load_state_dict(training_state["scheduler"])
        if changes:
            apply_optimizer_options(self.optimizer, self.scheduler, self.optimizer_args)
        self._restore_rng(path, training_state, trainer_state.get("world_size", 1))
        self.precision.load_state_dict(training_state.get("grad_scaler", {}))
        self.nonfinite_total = trainer_state.get("nonfinite_total", 0)
        self.step = trainer_state["step"]
        loop.load_state_dict({**trainer_state, **training_state})
        logger.info("resumed from %s at step %d", path, self.step)

    def _restore_rng(self, path: Path, training_state: dict, written_by: int) -> None:
        """Each process takes back its own random state. At another number of processes the run
        continues from the same weights, optimizer, data position and statistics, but with
        other random streams, so it no longer repeats what the original run would have done."""
        states = training_state.get("rng_per_process") or [training_state["rng"]]
        dist = self.dist
        if written_by != dist.world_size and dist.is_main:
            logger.warning(
                "%s was written by a run of %d process%s and this run has %d: it continues from the same weights, "
                "optimizer state, data position and statistics, but each process samples with other random numbers "
                "than the original run would have, so it is not an exact continuation of it (resume with %d processes "
                "for that).",
                path,
                written_by,
                "" if written_by == 1 else "es",
                dist.world_size,
                written_by,
            )
        if dist.rank < len(states):
            set_rng_state(states[dist.rank])
        else:
            seed_everything(self.run_args.seed + dist.rank + 1_000_003 * self.step)


class TrainingLoop:
    """What the harness runs (PPOTrainer, RewardTrainer, SFTTrainer), and what the command line
    reports. A loop's __init__ starts with `prepare` (below), and it defines the methods without a
    default."""

    name = "training"  # the progress bar's label
    progress: dict = {}  # {bar postfix label: stats key}
    more_steps_option = "--total_steps"  # the option that trains a finished run further

    @property
    def trained_module(self):
        """The module whose trainable parameters a checkpoint holds."""
        raise NotImplementedError

    def train_step(self) -> tuple[dict, list[dict] | dict | None]:
        """One step -> (stats, samples): rows for TensorBoard's text tab, a list (tag "samples",
        every log_samples_every steps) or {tag: rows} (other tags always), or None. The harness
        counts the steps."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        """The loop's own state for exact resume: tensors go to training_state.pt, the rest to JSON."""
        raise NotImplementedError

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError

    def builds_value_head(self) -> bool:
        """Whether `prepare` builds the hydra with a value head (self.config is set by then)."""
        return False

    def before_training(self):
        """Stats (or (stats, samples)) logged at step 0 of a fresh run, e.g. a held-out baseline; None: nothing."""
        return None

    def finish(self) -> dict | None:
        """Run before the final checkpoint; returns extra scalars for the last log line."""
        return None

    def write_extra(self, folder: Path) -> None:
        """Add files to a checkpoint folder before it is renamed into place."""

    @property
    def step(self) -> int:
        return self.harness.step

    total_steps: int  # the step the run ends at

    def summary(self, history: list[dict]) -> str:
        """What the command line prints when a run ends."""
        return f"done: step {self.step}."


def prepare(
    loop: TrainingLoop, config_cls, config, objects: dict, *, hydra=None, tokenizer=None, config_dir=None, inputs=None
):
    """What every trainer's __init__ does first, in this order (a random-init model depends on the seed):
    take its config (a `config_cls`, or the objects TRL's trainers take: train/api.py), anchor the
    config's relative paths at `config_dir` and check it, read the stage's inputs (train/inputs.py:
    its data and reward functions, checked before a model loads) unless the command line read them
    already (`inputs`), seed, pick the device and precision, and build the hydra the config names
    unless one is given (or wrap a transformers model given in `objects`), with the tokenizer given as
    `processing_class` when there is one (checked: train/api.check_processing_class), which the run then
    records: model.tokenizer_name_or_path names the folder of the run where the harness saves it
    (storage/run_tokenizer.py), so every checkpoint's config.yaml does. Sets the loop's config,
    harness, device, hydra and tokenizer; returns the inputs."""
    loop.config, model, tokenizer = trainer_inputs(config_cls, config, objects, tokenizer)
    config = loop.config
    run, lora, value_head = config.train, getattr(config, "lora", None), loop.builds_value_head()
    config.resolve_paths(config_dir)
    validate(config)
    # The Python API's first chance (the command line checked before): no model loads for a run that would be refused.
    # (The run's own saved tokenizer, which a resumed run's config may name, is for the claim to judge: Harness.run.)
    refuse_own_inputs(run.output_dir, besides_run_tokenizer(input_paths(config), run.output_dir), "train.output_dir")
    read_here = inputs is None  # (the command line read them, and checked the chat template, already)
    inputs = inputs if inputs is not None else read_inputs(config)
    given = objects.get("processing_class") is not None  # TRL's name of the tokenizer given in Python
    if given:  # refused now, before any model loads, if it cannot serve this run
        check_processing_class(config, inputs, tokenizer)
    if hydra is None and model is None:
        fetch_hub_models(config)  # a Hub id that cannot be had fails here, before any weights load
        if read_here and not given:
            refuse_without_chat_template(config, inputs)
    harness = Harness(run, config, max_nonfinite_steps=getattr(config, config.OPTIMIZER).max_nonfinite_steps)
    loaded = (model, None) if model is not None else None
    if hydra is None and getattr(run, "fsdp_trunk", False) and harness.dist.enabled:
        # Whole in CPU memory first; each process then keeps its shards of the frozen layers.
        hydra, tokenizer = build_hydra(
            config.model,
            lora,
            device="cpu",
            value_head=value_head,
            dtype_device=harness.device,
            loaded=loaded,
            tokenizer=tokenizer,
        )
        sharded, kept = shard_frozen_trunk(hydra, harness.dist, harness.device)
        hydra.to(harness.device)
        harness.trunk_sharded = True
        if harness.dist.is_main:
            logger.info(
                "FSDP: %d frozen parameters sharded over %d processes, %d of them on this one",
                sharded,
                harness.dist.world_size,
                kept,
            )
    elif hydra is None:
        hydra, tokenizer = build_hydra(
            config.model, lora, device=harness.device, value_head=value_head, loaded=loaded, tokenizer=tokenizer
        )
    elif tokenizer is None:
        raise ConfigError("pass the tokenizer together with a hydra model.")
    elif given:
        check_tokenizer_fits(hydra.model, tokenizer)
    if given:  # (as the hydra made it ready: its pad token and padding side, which a rebuilt run then reads)
        harness.given_tokenizer = tokenizer
        config.model.tokenizer_name_or_path = run_tokenizer_path(run.output_dir)
    loop.harness, loop.device, loop.hydra, loop.tokenizer = harness, harness.device, hydra, tokenizer
    return inputs
