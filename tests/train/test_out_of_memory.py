"""Out of memory (train/memory.py), injected on the CPU: in each phase of a step it ends the run
with one message naming the phase, the step, the sizes in play and the options that shrink them,
exit status 3 and no traceback; the step in flight is not logged, every checkpoint already written
is intact and --resume ends where an uninterrupted run ends. With train.oom_backoff the run
shrinks the chunk and goes on, and its result is that of the smaller chunks."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

import hydrappo.storage.checkpoint as checkpoint_module
from hydrappo.cli import main
from hydrappo.storage.checkpoint import WEIGHTS_NAME, checkpoint_dirs
from hydrappo.evaluation.heldout import HeldOutEvaluation
from hydrappo.train.memory import OutOfMemory
from hydrappo.train.ppo.step import PPOStep

from runs import TINY, tiny_trainer

pytestmark = pytest.mark.slow

RUN = ["--total_steps", "3", "--save_every", "1", "--batch_size", "8", "--mini_batch_size", "8", "--ppo_epochs", "1"]
RUN += ["--max_new_tokens", "4"]
CUDA_MESSAGE = "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 23.65 GiB total capacity)"


def fail_on_call(owner, name: str, monkeypatch, call: int, error: BaseException) -> None:
    """owner.name raises `error` on its `call`-th call (1-based), and runs as usual otherwise."""
    real, calls = getattr(owner, name), [0]

    def wrapped(*args, **kwargs):
        calls[0] += 1
        if calls[0] == call:
            raise error
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapped)


# phase in the message, what to break, its call that fails (step 2's), what the message names
PHASES = {
    "sampling": (PPOStep, "generate", 2, ["generation_batch_size 32", "responses 8", "max_new_tokens 4"]),
    "the experience pass": (PPOStep, "experience_pass", 2, ["sequences 8", "generation_batch_size 32"]),
    "scoring": (PPOStep, "score_rollout", 2, ["responses 8"]),
    "the update": (PPOStep, "minibatch_loss", 2, ["mini_batch_size 8", "micro_batch_rows 8"]),
    "held-out evaluation": (HeldOutEvaluation, "run", 3, ["prompts 12", "batch 32"]),  # step 0, 1, then 2
}


@pytest.mark.parametrize("phase", list(PHASES))
def test_out_of_memory_in_each_phase_ends_the_run_with_its_message(tmp_path, monkeypatch, capsys, phase):
    owner, name, call, sizes = PHASES[phase]
    fail_on_call(owner, name, monkeypatch, call, torch.OutOfMemoryError(CUDA_MESSAGE))
    held_out = ["--eval_prompts", str(TINY / "prompts.jsonl"), "--eval_every", "1"]
    output = tmp_path / "run"
    code = main(["train", str(TINY / "config.yaml"), "--output_dir", str(output), "--no_progress_bar", *RUN, *held_out])
    err = capsys.readouterr().err
    assert code == OutOfMemory.exit_code == 3
    assert f"out of memory in {phase} (step 2, " in err and "Traceback" not in err
    assert all(size in err for size in sizes), err
    assert "To fit: " in err and "train.oom_backoff" in err and "--resume" in err
    assert [path.name for path in checkpoint_dirs(output)] == ["checkpoint-1"]
    logged = [json.loads(line)["step"] for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert logged == [0, 1]  # the step in flight is not logged as done


def test_a_checkpoint_that_runs_out_of_host_memory_is_not_half_written(tmp_path, monkeypatch, capsys):
    fail_on_call(checkpoint_module, "save_file", monkeypatch, 2, MemoryError())
    output = tmp_path / "run"
    code = main(["train", str(TINY / "config.yaml"), "--output_dir", str(output), "--no_progress_bar", *RUN])
    err = capsys.readouterr().err
    assert code == 3 and "out of memory in writing a checkpoint (checkpoint checkpoint-2)" in err, err
    assert [path.name for path in checkpoint_dirs(output)] == ["checkpoint-1"]
    assert not [path for path in output.iterdir() if ".tmp-" in path.name]  # no temporary folder left


def test_resume_after_running_out_ends_where_an_uninterrupted_run_ends(tmp_path, monkeypatch):
    straight = tiny_trainer(tmp_path / "straight", *RUN)
    straight.train()
    fail_on_call(PPOStep, "minibatch_loss", monkeypatch, 2, torch.OutOfMemoryError(CUDA_MESSAGE))
    broken = tiny_trainer(tmp_path / "broken", *RUN)
    with pytest.raises(OutOfMemory, match="the update"):
        broken.train()
    monkeypatch.undo()
    resumed = tiny_trainer(tmp_path / "broken", *RUN)
    resumed.train(resume=True)
    for a, b in zip(straight.hydra.trainable_parameters(), resumed.hydra.trainable_parameters()):
        assert torch.equal(a, b)


def final_weights(folder):
    return load_file(str(checkpoint_dirs(folder)[-1] / WEIGHTS_NAME))


@pytest.mark.parametrize(
    "name, smaller",
    [
        ("generate", ["--generation_batch_size", "4"]),  # sampling's chunk 8 -> 4
        ("minibatch_loss", ["--gradient_accumulation_steps", "2"]),  # the update's micro-batches 8 -> 4 rows
    ],
)
def test_backing_off_gives_the_run_of_the_smaller_chunks(tmp_path, monkeypatch, name, smaller):
    """Out of memory on the first step's first try, with train.oom_backoff: the run halves the chunk
    and goes on, and ends bit for bit where a run started with the smaller chunk ends."""
    chunked = [*RUN, "--generation_batch_size", "8"]
    reference = tiny_trainer(tmp_path / "smaller", *chunked, *smaller)
    reference.train()
    fail_on_call(PPOStep, name, monkeypatch, 1, torch.OutOfMemoryError(CUDA_MESSAGE))
    backed_off = tiny_trainer(tmp_path / "backed-off", *chunked, "--oom_backoff", "2")
    history = backed_off.train()
    assert [row["oom/backoffs_total"] for row in history] == [1, 1, 1]
    assert backed_off.backoff.left == 1
    expected, got = final_weights(tmp_path / "smaller"), final_weights(tmp_path / "backed-off")
    assert expected.keys() == got.keys() and all(torch.equal(expected[k], got[k]) for k in expected)


def test_back_off_is_bounded(tmp_path, monkeypatch, caplog):
    fail_on_call(PPOStep, "generate", monkeypatch, 1, torch.OutOfMemoryError(CUDA_MESSAGE))
    fail_on_call(PPOStep, "generate", monkeypatch, 2, torch.OutOfMemoryError(CUDA_MESSAGE))
    trainer = tiny_trainer(tmp_path / "run", *RUN, "--oom_backoff", "1")
    with pytest.raises(OutOfMemory, match=r"out of memory in sampling \(step 1, responses 8, generation_batch_size 16"):
        trainer.train()
    assert "generation.generation_batch_size 32 -> 16" in caplog.text
