"""Data parallelism on torch.distributed (train/distributed.py): results that do not depend on
the number of processes, exact resume at the same number, one failing process stopping all.
The multi-process tests start 2 processes themselves (gloo on the CPU, tests/helpers/processes.py)."""

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hydrappo.algo.losses import aggregate, aggregation_weights
from hydrappo.algo.masked import explained_variance, explained_variance_of_parts, explained_variance_parts
from hydrappo.config import RewardConfig, SFTConfig, parse_config
from hydrappo.storage.checkpoint import WEIGHTS_NAME
from hydrappo.train.distributed import ProcessGroup
from hydrappo.train.ppo.experience import minibatch_plan
from hydrappo.train.ppo import PPOTrainer
from hydrappo.train.reward_model import RewardTrainer
from hydrappo.train.sft import SFTTrainer

from bounds import ADAM_EPS, EXACT, SCALAR_NOISE, assert_close_weights
from distributed_worker import HELDOUT, VARIANTS, heldout_run, ppo_variants
from processes import check_ok, describe, launch
from runs import TINY, agent_run_options, reward_config, save_tiny_tool_tokenizer, write_sft_config


def weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / f"checkpoint-{step}" / WEIGHTS_NAME))


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def assert_equal_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and a
    for name in a:
        assert torch.equal(a[name], b[name]), name


def assert_same_scalars(a: dict, b: dict, ignore: tuple[str, ...] = ()) -> None:
    """Every logged scalar but the timings (and names ending in `ignore`), within float64 noise
    (see tests/helpers/bounds.py)."""
    keys = {k for k in a if not k.startswith("time/")}
    assert keys == {k for k in b if not k.startswith("time/")}
    for key in sorted(k for k in keys if not k.endswith(ignore)):
        assert b[key] == pytest.approx(a[key], rel=SCALAR_NOISE, abs=1e-12), key


# ---------------------------------------------------------------------------- the pieces, by hand
def test_aggregating_parts_with_the_whole_count_adds_up_to_the_whole():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [5.0, 6.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [0, 0, 0]])
    # token-mean: 21 / 6; seq-mean-token-mean: (2 + 4 + 5.5) / 3 rows with tokens; seq-mean-token-sum: (6 + 4 + 11) / 3.
    for mode, whole in (("token-mean", 21 / 6), ("seq-mean-token-mean", 11.5 / 3), ("seq-mean-token-sum", 7.0)):
        assert aggregate(x, mask, mode).item() == pytest.approx(whole)
        count = aggregation_weights(mask, mode).sum()
        assert count.item() == (6 if mode == "token-mean" else 3)
        halves = aggregate(x[:1], mask[:1], mode, count) + aggregate(x[1:], mask[1:], mode, count)
        assert halves.item() == pytest.approx(whole)
    assert aggregation_weights(mask, "token-mean").tolist() == [3, 1, 2, 0]
    assert aggregation_weights(mask, "seq-mean-token-sum").tolist() == [1, 1, 1, 0]


def test_explained_variance_from_parts_is_that_of_the_whole():
    torch.manual_seed(0)
    values, returns = torch.randn(6, 5, dtype=torch.float64), torch.randn(6, 5, dtype=torch.float64) * 2 + 1
    mask = torch.rand(6, 5) > 0.3
    whole = explained_variance(values, returns, mask).item()
    parts = [explained_variance_parts(values[rows], returns[rows], mask[rows]) for rows in (slice(0, 2), slice(2, 6))]
    tokens = [mask[:2].sum(), mask[2:].sum()]
    means = (parts[0] * tokens[0] + parts[1] * tokens[1]) / (tokens[0] + tokens[1])
    # Both ways sum the same n float64 terms in another order: each of the four token means is off
    # by at most n * 2**-53 * (its largest term), and 1 - (E[e^2] - E[e]^2) / (E[R^2] - E[R]^2) turns
    # an error d of a mean into at most d * (1 + 2 |mean|) / Var(R) * (1 + Var(e) / Var(R)).
    # The bound is ~1e-12 here; a token counted twice or missed moves the value by ~1e-2.
    residual = returns - values
    n, largest = int(mask.sum()), max(returns[mask].square().max(), residual[mask].square().max()).item()
    var_r, var_e = (masked.var(unbiased=False).item() for masked in (returns[mask], residual[mask]))
    spread = 1 + 2 * means.abs().max().item()
    bound = n * 2**-53 * largest * spread / var_r * (1 + var_e / var_r)
    assert abs(explained_variance_of_parts(*means.tolist()) - whole) <= bound
    assert bound < 1e-10  # float64 noise, far below what a logic error moves


def test_minibatches_are_stratified_so_every_process_holds_an_equal_share_of_each():
    plan = minibatch_plan(16, 8, torch.Generator().manual_seed(0))
    assert plan.shape == (2, 8)
    assert sorted(plan.flatten().tolist()) == list(range(16))  # every row once per epoch
    for rows in plan:  # one row of each stratum of 2: processes of 2, 4 or 8 each hold rows/K of them
        assert [row // 2 for row in rows.tolist()] == list(range(8))
        for k in (2, 4, 8):
            share = 16 // k
            assert [sum(r * share <= row < (r + 1) * share for row in rows.tolist()) for r in range(k)] == [8 // k] * k
    # A seeded generator draws the same plan, whatever the number of processes.
    assert torch.equal(plan, minibatch_plan(16, 8, torch.Generator().manual_seed(0)))


def test_one_process_is_the_same_as_before():
    group = ProcessGroup()
    assert not group.enabled and group.is_main
    assert group.shard([1, 2, 3]) == [1, 2, 3]
    tensor = torch.ones(2, 3)
    assert group.gather_rows(tensor) is tensor
    assert group.map_in_order(lambda batch: sum(batch), [[1, 2], [3]], "adding") == [3, 3]
    with pytest.raises(ValueError, match="boom"), group.phase("failing"):
        raise ValueError("boom")


def test_shares_of_a_batch_are_contiguous_and_differ_by_at_most_one():
    shares = [ProcessGroup(rank, 3).shard(list(range(10))) for rank in range(3)]
    assert shares == [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]
    assert ProcessGroup(1, 4).shard([7, 8]) == [7]  # a small last batch leaves some processes nothing


def test_a_batch_that_processes_cannot_share_is_a_clear_error(tmp_path, monkeypatch):
    from hydrappo.config import ConfigError

    monkeypatch.setattr(
        ProcessGroup, "from_environment", classmethod(lambda cls, device, timeout: (cls(0, 4), torch.device("cpu")))
    )
    config = parse_config(
        TINY / "config.yaml", ["--output_dir", str(tmp_path), "--batch_size", "6", "--mini_batch_size", "2"]
    )
    with pytest.raises(ConfigError, match="6 prompts x 1 samples, which 4 processes cannot share"):
        PPOTrainer(config, config_dir=TINY)


# ---------------------------------------------------------------------------- 2 processes
@pytest.mark.slow
def test_a_ppo_step_on_two_processes_equals_one_process_on_the_whole_batch(tmp_path):
    """The same fixed responses (distributed_worker.fixed_generate): 2 processes x 4 responses and
    1 process x 8 end with the same weights and log the same statistics, for PPO with a critic
    (GAE, whitened advantages) and two critic-free estimators (GRPO with groups of 2, KL in the
    loss; REINFORCE++, whose token returns are whitened over the whole batch)."""
    check_ok(launch(["tests/helpers/distributed_worker.py", "ppo", str(tmp_path / "two")], timeout=180))
    ppo_variants(tmp_path / "one")
    for name in VARIANTS:
        one, two = tmp_path / "one" / name, tmp_path / "two" / name
        assert_close_weights(weights(one, 1), weights(two, 1), lr=1e-4, steps=4)  # 2 epochs x 2 minibatches
        assert_same_scalars(metrics(one)[-1], metrics(two)[-1])
        state_one, state_two = (json.loads((d / "checkpoint-1" / "trainer_state.json").read_text()) for d in (one, two))
        assert state_two["world_size"] == 2 and state_one["world_size"] == 1
        assert state_two["kl_controller"]["value"] == pytest.approx(
            state_one["kl_controller"]["value"], rel=SCALAR_NOISE
        )
        assert state_two["score_moments"]["count"] == state_one["score_moments"]["count"] == 8
        assert state_two["score_moments"]["mean"] == pytest.approx(state_one["score_moments"]["mean"], rel=SCALAR_NOISE)
    # During the critic's warm-up the policy (every weight but the value head's) stays exactly as
    # on 1 process, where the optimizer skips it: no zero-gradient step with weight decay.
    one, two = (weights(tmp_path / k / "critic_warmup", 1) for k in ("one", "two"))
    policy = [name for name in one if not name.startswith("value_head.")]
    assert policy and all(torch.equal(one[name], two[name]) for name in policy)


SMALL_RUN = [
    "--total_steps",
    "4",
    "--save_every",
    "2",
    "--batch_size",
    "8",
    "--mini_batch_size",
    "4",
    "--lr_scheduler",
    "cosine",
    "--warmup_steps",
    "1",
    "--kl_controller",
    "adaptive",
    "--score_normalization",
    "running",
    "--no_progress_bar",
]


def train_small(out: Path, *extra: str, worker: str | None = None, timeout: float = 90):
    command = ["tests/helpers/distributed_worker.py", worker] if worker else ["-m", "hydrappo"]
    return launch(
        [*command, "train", str(TINY / "config.yaml"), *SMALL_RUN, "--output_dir", str(out), *extra], timeout=timeout
    )


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """An uninterrupted 2-process run of SMALL_RUN."""
    out = tmp_path_factory.mktemp("distributed") / "straight"
    check_ok(train_small(out))
    return out


@pytest.mark.slow
def test_a_two_process_run_killed_after_its_first_checkpoint_resumes_exactly(tmp_path, straight, caplog):
    train = train_small
    killed = train(tmp_path / "resumed", worker="die-after-first-save")
    assert [r.returncode for r in killed] == [3, 3], describe(killed)
    assert sorted(p.name for p in (tmp_path / "resumed").glob("checkpoint-*")) == ["checkpoint-2"]
    shutil.copytree(tmp_path / "resumed", tmp_path / "one-process")
    check_ok(train(tmp_path / "resumed", "--resume"))

    assert_equal_weights(weights(straight, 4), weights(tmp_path / "resumed", 4))
    assert [row["step"] for row in metrics(tmp_path / "resumed")] == [1, 2, 3, 4]
    for a, b in zip(metrics(straight)[2:], metrics(tmp_path / "resumed")[2:]):
        assert {k: v for k, v in a.items() if not k.startswith("time/")} == {
            k: v for k, v in b.items() if not k.startswith("time/")
        }
    saved = torch.load(tmp_path / "resumed" / "checkpoint-4" / "training_state.pt", weights_only=True)
    assert len(saved["rng_per_process"]) == 2
    assert not torch.equal(saved["rng_per_process"][0]["torch"], saved["rng_per_process"][1]["torch"])

    # At another number of processes the run goes on, and says it is not an exact continuation.
    config = parse_config(TINY / "config.yaml", [*SMALL_RUN, "--output_dir", str(tmp_path / "one-process")])
    with caplog.at_level(logging.WARNING, logger="hydrappo"):
        history = PPOTrainer(config, config_dir=TINY).train(resume=True)
    assert [row["step"] for row in history] == [3, 4]
    assert "written by a run of 2 processes and this run has 1" in caplog.text


@pytest.mark.slow
def test_a_multi_turn_run_on_two_processes_resumes_exactly(tmp_path):
    """Episodes with an environment's tools and reward (each process runs its share of the groups,
    the tool turns as context): a 2-process run killed after its first checkpoint and resumed ends
    with the weights and the logged statistics of the uninterrupted 2-process run."""
    agent = agent_run_options(save_tiny_tool_tokenizer(tmp_path / "tokenizer"))
    check_ok(train_small(tmp_path / "straight", *agent))
    killed = train_small(tmp_path / "resumed", *agent, worker="die-after-first-save")
    assert [r.returncode for r in killed] == [3, 3], describe(killed)
    check_ok(train_small(tmp_path / "resumed", *agent, "--resume"))

    straight = metrics(tmp_path / "straight")
    assert any(row.get("agent/tool_rounds_mean", 0) > 0 for row in straight)  # tools were called
    assert "env/reward/Shelf" in straight[-1]
    assert_equal_weights(weights(tmp_path / "straight", 4), weights(tmp_path / "resumed", 4))
    for a, b in zip(straight[2:], metrics(tmp_path / "resumed")[2:]):
        assert {k: v for k, v in a.items() if not k.startswith("time/")} == {
            k: v for k, v in b.items() if not k.startswith("time/")
        }


@pytest.mark.slow
def test_held_out_evaluation_on_two_processes_equals_one_and_resumes_exactly(tmp_path):
    """Held-out evaluation (evaluation/heldout.py) deals its 3 batches of sampled answers to the
    processes, each batch seeded by itself. At step 0 the weights are the same on 1 and 2
    processes, so every eval/* number must be equal; at steps 2 and 3 the weights agree within
    float64 noise (the note above ADAM_EPS), which could change a sampled token only where a draw
    lands within ~1e-12 of a probability boundary: the eval numbers agree to SCALAR_NOISE. A
    2-process run killed after its checkpoint at step 2 and resumed then ends exactly as an
    uninterrupted one, its evaluations included, and does not repeat the step-0 baseline."""
    eval_prompts = tmp_path / "held_out.jsonl"
    eval_prompts.write_text("".join((TINY / "prompts.jsonl").read_text().splitlines(keepends=True)[-12:]))
    check_ok(
        launch(
            ["tests/helpers/distributed_worker.py", "heldout", str(tmp_path / "two"), str(eval_prompts)], timeout=180
        )
    )
    heldout_run(tmp_path / "one", str(eval_prompts))
    one, two = metrics(tmp_path / "one"), metrics(tmp_path / "two")

    def evaluated(rows):
        return {r["step"]: {k: v for k, v in r.items() if k.startswith("eval/")} for r in rows if "eval/prompts" in r}

    assert sorted(evaluated(one)) == sorted(evaluated(two)) == [0, 2, 3]
    assert evaluated(one)[0] == evaluated(two)[0] and evaluated(two)[0]["eval/prompts"] == 12
    for step in (2, 3):
        assert_same_scalars(evaluated(one)[step], evaluated(two)[step])
    lr = float(HELDOUT[HELDOUT.index("--learning_rate") + 1])
    assert_close_weights(
        weights(tmp_path / "one", 3), weights(tmp_path / "two", 3), lr=lr, steps=6
    )  # 3 steps x 2 updates

    killed = launch(
        ["tests/helpers/distributed_worker.py", "heldout", str(tmp_path / "resumed"), str(eval_prompts), "die"],
        timeout=180,
    )
    assert [r.returncode for r in killed] == [3, 3], describe(killed)
    check_ok(
        launch(
            ["tests/helpers/distributed_worker.py", "heldout", str(tmp_path / "resumed"), str(eval_prompts), "resume"],
            timeout=180,
        )
    )
    assert_equal_weights(weights(tmp_path / "two", 3), weights(tmp_path / "resumed", 3))
    strip = lambda row: {k: v for k, v in row.items() if not k.startswith("time/")}  # noqa: E731
    assert [strip(r) for r in metrics(tmp_path / "resumed")] == [strip(r) for r in two]


@pytest.mark.slow
def test_a_trunk_sharded_with_fsdp2_trains_like_a_whole_one(tmp_path):
    """Each process keeps half of the frozen layers (the bottom 2 and the reference's copies of
    the top 2: 4 layers of 36,992 parameters), generates in lockstep with the other, and the run
    ends with the weights of the unsharded 2-process run. A sharded trunk runs the experience
    pass over the whole trunk (generation.reuse_trunk_pass does not apply) and samples with
    transformers' generate (the one sampler that runs in lockstep), so the unsharded run it is
    compared with bit for bit does too."""
    results = train_small(tmp_path / "fsdp", "--fsdp_trunk")
    check_ok(results)
    assert "FSDP: 147968 frozen parameters sharded over 2 processes, 73984 of them on this one" in results[0].stderr
    check_ok(train_small(tmp_path / "whole", "--reuse_trunk_pass", "false", "--sampler", "generate"))
    assert_equal_weights(weights(tmp_path / "whole", 4), weights(tmp_path / "fsdp", 4))


@pytest.mark.slow
def test_a_band_on_a_sharded_trunk_trains_like_a_whole_one(tmp_path):
    """Band 1:3 of 4: the layer below and the reference's copies of the band (3 layers of 36,992
    parameters) are sharded; the band and the frozen layer above it stay whole on each process."""
    band = ["--trainable_layers", "1:3", "--train_lm_head", "false"]
    results = train_small(tmp_path / "fsdp", *band, "--fsdp_trunk", timeout=300)
    check_ok(results)
    assert "FSDP: 110976 frozen parameters sharded over 2 processes, 55488 of them on this one" in results[0].stderr
    check_ok(
        train_small(tmp_path / "whole", *band, "--reuse_trunk_pass", "false", "--sampler", "generate", timeout=300)
    )
    assert_equal_weights(weights(tmp_path / "whole", 4), weights(tmp_path / "fsdp", 4))


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["reward", "sft"])
def test_supervised_stages_on_two_processes_end_with_the_weights_of_one(tmp_path, stage):
    # 4 steps of 16 examples, 8 per process; the held-out evaluation is shared between them.
    if stage == "reward":
        config = reward_config(tmp_path, max_steps=4, save_every=0)
        path, trainer_cls, config_cls = tmp_path / "reward.yaml", RewardTrainer, RewardConfig
    else:
        path = write_sft_config(tmp_path, max_steps=4, save_every=0)
        trainer_cls, config_cls = SFTTrainer, SFTConfig
        config = parse_config(path, [], config_cls=config_cls)
    # In float64: see tests/helpers/bounds.py.
    check_ok(launch(["-m", "hydrappo", stage, str(path), "--output_dir", str(tmp_path / "two"), *EXACT]))
    config.train.output_dir = str(tmp_path / "one")
    config.model.dtype, config.train.adam_eps = "float64", ADAM_EPS
    trainer_cls(config, config_dir=tmp_path).train()
    one_weights, two_weights = weights(tmp_path / "one", 4), weights(tmp_path / "two", 4)
    ignore = ()
    if stage == "reward":
        # The Bradley-Terry loss depends on r_chosen - r_rejected only: the score head's bias gets
        # a gradient of exactly 0, and what moves it is rounding noise that AdamW scales up to the
        # learning rate; it differs between any two ways of summing the same batch, and so do the
        # mean scores (not their differences).
        for bias in (one_weights, two_weights):
            assert bias.pop("head.score.bias").shape == (1,)
        ignore = ("chosen_score", "rejected_score", "score_mean")
    assert_close_weights(one_weights, two_weights, lr=config.train.learning_rate, steps=4)
    one, two = metrics(tmp_path / "one"), metrics(tmp_path / "two")
    assert len(one) == len(two) and "eval/loss" in one[-1]
    for a, b in zip(one, two):
        assert_same_scalars(a, b, ignore)


@pytest.mark.slow
def test_a_reward_function_raising_on_one_process_stops_both_with_its_message(tmp_path):
    (tmp_path / "flaky.py").write_text(
        "import os\n\n\n"
        "def reward_fn(samples, prompts, outputs, **kwargs):\n"
        "    if os.environ['RANK'] == '1':\n"
        "        raise ConnectionError('the reward server did not answer')\n"
        "    return [0.0] * len(outputs)\n"
    )
    results = launch(
        [
            "-m",
            "hydrappo",
            "train",
            str(TINY / "config.yaml"),
            "--output_dir",
            str(tmp_path / "out"),
            "--reward_fn",
            f"{tmp_path / 'flaky.py'}:reward_fn",
            "--total_steps",
            "2",
        ],
        timeout=60,
    )
    assert all(r.returncode != 0 for r in results), describe(results)
    assert "the reward server did not answer" in results[1].stderr
    assert (
        "hydrappo train (process 0 of 2): process 1 of 2 failed while scoring responses: reward function "
        f"'{tmp_path / 'flaky.py'}:reward_fn' at step 1 raised ConnectionError: the reward server did not answer"
        in results[0].stderr
    ), describe(results)
    assert not list((tmp_path / "out").glob("checkpoint-*"))


@pytest.mark.slow
def test_a_signal_to_one_process_stops_both_after_the_same_step_with_its_checkpoint(tmp_path):
    """SIGTERM reaches process 1 alone, during step 2: at the end of that step the processes agree
    to stop, process 0 writes checkpoint-2, and both exit 143 naming it."""
    (tmp_path / "preempted.py").write_text(
        "import os, signal\n\nCALLS = []\n\n\n"
        "def reward_fn(samples, prompts, outputs, **kwargs):\n"
        "    CALLS.append(1)\n"
        "    if os.environ['RANK'] == '1' and len(CALLS) == 2:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return [0.0] * len(outputs)\n"
    )
    out = tmp_path / "out"
    results = launch(
        [
            "-m",
            "hydrappo",
            "train",
            str(TINY / "config.yaml"),
            "--output_dir",
            str(out),
            "--reward_fn",
            f"{tmp_path / 'preempted.py'}:reward_fn",
            "--total_steps",
            "5",
            "--save_every",
            "0",
            "--batch_size",
            "8",
            "--mini_batch_size",
            "4",
            "--ppo_epochs",
            "1",
            "--no_progress_bar",
        ]
    )
    assert [r.returncode for r in results] == [143, 143], describe(results)
    for result in results:
        assert f"stopped by SIGTERM after step 2; checkpoint {out / 'checkpoint-2'} holds it" in result.stderr, (
            describe(results)
        )
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-")) == ["checkpoint-2"]
    assert [row["step"] for row in metrics(out)] == [1, 2]


@pytest.mark.slow
def test_overwrite_output_dir_on_two_processes_moves_the_earlier_run_aside_once(tmp_path):
    out = tmp_path / "out"
    (out / "checkpoint-1").mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    argv = [
        "-m",
        "hydrappo",
        "train",
        str(TINY / "config.yaml"),
        "--output_dir",
        str(out),
        "--total_steps",
        "1",
        "--batch_size",
        "8",
        "--mini_batch_size",
        "4",
        "--ppo_epochs",
        "1",
        "--no_progress_bar",
    ]
    refused = launch(argv)
    assert [r.returncode for r in refused] == [2, 2], describe(refused)
    assert all("already holds a run (checkpoint-1, metrics.jsonl)" in r.stderr for r in refused), describe(refused)
    check_ok(launch([*argv, "--overwrite_output_dir"]))
    moved = list(tmp_path.glob("out.previous*"))
    assert len(moved) == 1 and (moved[0] / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert [row["step"] for row in metrics(out)] == [1]
