"""Reward branch training: Bradley–Terry loss, held-out accuracy on a synthetic preference
rule, checkpoint round trip into HydraModel's reward slot, PPO on the learned reward."""

import json
import math

import pytest
import torch
import yaml
from safetensors.torch import load_file

from hydrappo import HydraModel
from hydrappo.algo.losses import preference_loss
from hydrappo.algo.scores import score_statistics
from hydrappo.cli import main as cli_main
from hydrappo.config import RewardConfig, parse_config
from hydrappo.data import split_by_prompt
from hydrappo.storage.checkpoint import WEIGHTS_NAME, CheckpointError
from hydrappo.storage.reward_branch import load_reward_branch
from hydrappo.train.ppo import PPOTrainer
from hydrappo.train.reward_model import RewardTrainer
from hydrappo.data import pack_sequences

from runs import TINY, branch_ppo_config, reward_config, write_pairs
from tiny import FLOAT64_ATOL


# The trained branch is compared with fresh hydras, padded batches with single rows: in float64,
# within FLOAT64_ATOL (tests/helpers/tiny.py says why); the trunks it goes on are float64 too.
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reward")
    trainer = RewardTrainer(reward_config(tmp, dtype="float64"), config_dir=tmp)
    history = trainer.train()
    return tmp, trainer, history


def test_preference_loss_matches_hand_computation():
    chosen, rejected = torch.tensor([2.0, 0.0, -1.0]), torch.tensor([0.0, 0.0, 1.0])
    loss, stats = preference_loss(chosen, rejected)
    softplus = lambda x: math.log1p(math.exp(x))  # -log sigmoid(x) = softplus(-x)  # noqa: E731
    assert loss.item() == pytest.approx((softplus(-2) + softplus(0) + softplus(2)) / 3, rel=1e-6)
    assert stats["accuracy"].item() == pytest.approx((1 + 0.5 + 0) / 3)  # a tie counts half
    assert stats["margin"].item() == pytest.approx(0.0)
    loss, _ = preference_loss(chosen, rejected, torch.tensor([1.0, 0.0, 0.0]))
    assert loss.item() == pytest.approx((softplus(-1) + softplus(0) + softplus(2)) / 3, rel=1e-6)
    # Huge gaps stay finite and the gradient points the right way.
    chosen = torch.tensor([-500.0], requires_grad=True)
    loss, _ = preference_loss(chosen, torch.tensor([500.0]))
    loss.backward()
    assert math.isfinite(loss.item()) and loss.item() == pytest.approx(1000.0) and chosen.grad.item() < 0

    assert score_statistics(torch.tensor([1.0, 3.0])) == pytest.approx((2.0, math.sqrt(2.0)))
    with pytest.raises(ValueError, match="degenerate"):
        score_statistics(torch.tensor([1.0, 1.0]))


def test_eval_split_holds_out_whole_prompts():
    prompts = [f"p{i % 10}" for i in range(40)]
    train, held = split_by_prompt(prompts, 0.2, seed=0)
    assert sorted(train + held) == list(range(40))
    assert len({prompts[i] for i in held}) == 2 and len(held) == 8
    assert not {prompts[i] for i in held} & {prompts[i] for i in train}
    assert split_by_prompt(prompts, 0.2, seed=0) == (train, held)
    assert split_by_prompt(prompts, 0.0, seed=0) == (list(range(40)), [])


@pytest.mark.slow
def test_reward_branch_learns_the_preference_rule_and_logs(trained):
    tmp, trainer, history = trained
    evals = [row for row in history if "eval/accuracy" in row]
    assert evals[-1]["eval/accuracy"] >= 0.9, evals
    assert evals[-1]["eval/loss"] < math.log(2) * 0.6
    assert len(trainer.eval_pairs) >= 50  # the accuracy is over enough held-out pairs to mean something

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp / "reward" / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    for name in ("train/loss", "train/accuracy", "train/margin", "lr"):
        assert len(events.Scalars(name)) == trainer.step, name
    for name in ("eval/loss", "eval/accuracy", "eval/margin"):
        assert len(events.Scalars(name)) == 2, name  # end of each epoch
    metrics = [json.loads(line) for line in (tmp / "reward" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in metrics] == list(range(1, trainer.step + 1))

    # The checkpoint holds the branch only: its top layers, norm and head, no trunk.
    weights = load_file(str(trainer.checkpoint_path / WEIGHTS_NAME))
    assert {name.split(".")[0] for name in weights} == {"layers", "norm", "head"}
    assert {name.split(".")[1] for name in weights if name.startswith("layers.")} == {"0", "1"}
    info = json.loads((trainer.checkpoint_path / "trainer_state.json").read_text())
    assert info["kind"] == "hydrappo-reward-branch" and info["base_model"]["num_layers_unfrozen"] == 2
    assert info["eval"]["eval/accuracy"] == evals[-1]["eval/accuracy"]


@pytest.mark.slow
def test_saved_branch_scores_like_the_trainer_in_a_fresh_hydra(trained):
    tmp, trainer, _ = trained
    pairs = trainer.eval_pairs
    prompts, responses = pairs.prompt_ids[:12] * 2, pairs.chosen_ids[:12] + pairs.rejected_ids[:12]
    expected = trainer.score(prompts, responses)

    # A fresh trunk built the way PPO builds it (same seed, random init), other PPO options.
    from hydrappo.config import ModelConfig
    from hydrappo.storage.models import load_model_and_tokenizer

    torch.manual_seed(0)
    model, _ = load_model_and_tokenizer(
        ModelConfig(name_or_path=str(TINY / "model"), random_init=True), dtype=torch.float64
    )
    hydra = HydraModel(model, 2, train_lm_head=True, train_final_norm=True)
    hydra.attach_reward_branch(load_reward_branch(hydra, tmp / "reward"))  # the output_dir: latest checkpoint
    input_ids, attention_mask, _, _ = pack_sequences(prompts, responses, trainer.tokenizer.pad_token_id)
    with torch.no_grad():
        scores = hydra.forward_hydra(input_ids, attention_mask).scores
    torch.testing.assert_close(scores, expected, atol=FLOAT64_ATOL, rtol=0)
    # Not a constant: chosen beats rejected on most of these held-out pairs.
    assert (scores[:12] > scores[12:]).float().mean() >= 0.75

    # The stored statistics are those of the branch's scores on the training texts.
    train = trainer.train_pairs
    all_scores = trainer.score(train.prompt_ids * 2, train.chosen_ids + train.rejected_ids)
    mean, std = score_statistics(all_scores)
    info = hydra.reward_branch.checkpoint_info
    assert info["score_mean"] == pytest.approx(mean, abs=1e-4) and info["score_std"] == pytest.approx(std, rel=1e-4)


@pytest.mark.slow
def test_reward_checkpoints_that_do_not_fit_are_clear_errors(trained, tmp_path):
    tmp, trainer, _ = trained
    from hydrappo.config import ModelConfig
    from hydrappo.storage.models import load_model_and_tokenizer

    from tiny import tiny_model

    def tiny_example_trunk(seed=0):
        torch.manual_seed(seed)
        return load_model_and_tokenizer(
            ModelConfig(name_or_path=str(TINY / "model"), random_init=True), dtype=torch.float64
        )[0]

    with pytest.raises(CheckpointError, match="num_layers_unfrozen: 2"):
        load_reward_branch(HydraModel(tiny_example_trunk(), 1), tmp / "reward")
    with pytest.raises(CheckpointError, match="hidden size is 64, this model's is 32"):
        load_reward_branch(HydraModel(tiny_model("llama"), 2), tmp / "reward")
    with pytest.raises(CheckpointError, match="frozen bottom differs"):
        load_reward_branch(HydraModel(tiny_example_trunk(seed=1), 2), tmp / "reward")
    # A PPO checkpoint is not a reward checkpoint.
    ppo = PPOTrainer(
        parse_config(
            TINY / "config.yaml",
            [
                "--output_dir",
                str(tmp_path / "ppo"),
                "--total_steps",
                "1",
                "--batch_size",
                "8",
                "--mini_batch_size",
                "8",
                "--no_progress_bar",
            ],
        ),
        config_dir=TINY,
    )
    ppo.train()
    with pytest.raises(CheckpointError, match="not a reward checkpoint"):
        load_reward_branch(ppo.hydra, tmp_path / "ppo")
    with pytest.raises(CheckpointError, match="does not exist"):
        load_reward_branch(ppo.hydra, tmp_path / "nowhere")


@pytest.mark.slow
def test_ppo_optimises_the_learned_reward_with_its_reference_statistics(trained, tmp_path):
    tmp, trainer, _ = trained
    path = branch_ppo_config(tmp_path, tmp / "reward", {"score_normalization": "ref"}, total_steps=8, save_every=8)
    ppo = PPOTrainer(parse_config(path), config_dir=tmp_path)
    assert ppo.config.reward.score_ref_mean == pytest.approx(trainer.score_stats["score_mean"])
    assert ppo.config.reward.score_ref_std == pytest.approx(trainer.score_stats["score_std"])
    history = ppo.train()

    first = history[0]
    mean, std = trainer.score_stats["score_mean"], trainer.score_stats["score_std"]
    assert first["env/score_used_mean"] == pytest.approx((first["env/reward_mean"] - mean) / std, abs=1e-4)
    rewards = [row["env/reward_mean"] for row in history]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.5, rewards  # the learned reward goes up
    # The statistics went into the run's saved config.
    saved = yaml.safe_load((tmp_path / "checkpoint-8" / "config.yaml").read_text())
    assert saved["reward"]["score_ref_mean"] == pytest.approx(mean)


def test_cli_reward_with_sampled_reference_statistics(tmp_path, capsys):
    reward_config(tmp_path)  # writes reward.yaml and pairs.jsonl
    code = cli_main(
        [
            "reward",
            str(tmp_path / "reward.yaml"),
            "--max_steps",
            "2",
            "--cache_split_hidden",
            "false",
            "--stats_file",
            str(TINY / "prompts.jsonl"),
            "--stats_max_samples",
            "8",
            "--stats_max_new_tokens",
            "4",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "done: step 2" in out and "model.reward_branch_path" in out
    info = json.loads((tmp_path / "reward" / "checkpoint-2" / "trainer_state.json").read_text())
    assert info["score_stats"] == {
        "count": 8,
        "source": f"base-policy responses to 8 prompts of {TINY / 'prompts.jsonl'}",
    }
    assert info["score_std"] > 0
    assert (
        cli_main(
            [
                "reward",
                str(tmp_path / "reward.yaml"),
                "--chosen_column",
                "better",
                "--output_dir",
                str(tmp_path / "another"),
            ]
        )
        == 2
    )
    assert "no column 'better'" in capsys.readouterr().err


def test_whole_text_pairs_with_margins(tmp_path):
    """No prompt column (chosen/rejected hold the whole texts) and a margin column."""
    write_pairs(tmp_path / "source.jsonl", pairs_per_prompt=1)
    rows = [json.loads(line) for line in (tmp_path / "source.jsonl").read_text().splitlines()]
    with (tmp_path / "pairs.jsonl").open("w") as handle:
        for i, row in enumerate(rows):
            whole = {
                "better": row["prompt"] + " " + row["chosen"],
                "worse": row["prompt"] + " " + row["rejected"],
                "m": i % 3,
            }
            handle.write(json.dumps(whole) + "\n")
    (tmp_path / "reward.yaml").write_text(
        yaml.safe_dump(
            {
                "model": {"name_or_path": str(TINY / "model"), "random_init": True, "num_layers_unfrozen": 1},
                "data": {
                    "train_file": "pairs.jsonl",
                    "prompt_column": None,
                    "chosen_column": "better",
                    "rejected_column": "worse",
                    "margin_column": "m",
                    "max_response_length": 20,
                },
                "train": {"output_dir": str(tmp_path / "out"), "max_steps": 2, "progress_bar": False},
            }
        )
    )
    config = parse_config(tmp_path / "reward.yaml", [], config_cls=RewardConfig)
    trainer = RewardTrainer(config, config_dir=tmp_path)
    pairs = trainer.eval_pairs
    assert len(pairs) > 5 and all(ids == [] for ids in pairs.prompt_ids)
    assert set(pairs.margins) <= {0.0, 1.0, 2.0} and len(set(pairs.margins)) > 1
    stats = trainer.evaluate()
    chosen = trainer.score(pairs.prompt_ids, pairs.chosen_ids)
    rejected = trainer.score(pairs.prompt_ids, pairs.rejected_ids)
    loss, _ = preference_loss(chosen, rejected, torch.tensor(pairs.margins))
    assert stats["eval/loss"] == pytest.approx(loss.item(), rel=1e-5)
    assert stats["eval/loss"] != pytest.approx(preference_loss(chosen, rejected)[0].item(), rel=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_pooling_scores_the_same_through_ppo_scoring_as_in_the_reward_stage(tmp_path, pooling):
    """The branch's pooling is recorded in its checkpoint and forward_hydra (PPO's scoring,
    with logprobs_from as rollout passes it) pools identically, whatever the padding."""
    # In float64: padded batches against single rows, within FLOAT64_ATOL (tests/helpers/tiny.py says why).
    trainer = RewardTrainer(
        reward_config(tmp_path, dtype="float64", epochs=1, max_steps=3, pooling=pooling), config_dir=tmp_path
    )
    trainer.train()
    info = json.loads((trainer.checkpoint_path / "trainer_state.json").read_text())
    assert info["pooling"] == pooling
    pairs = trainer.eval_pairs
    prompts, responses = pairs.prompt_ids[:6] * 2, pairs.chosen_ids[:6] + pairs.rejected_ids[:6]
    expected = trainer.score(prompts, responses)

    from hydrappo.config import ModelConfig
    from hydrappo.storage.models import load_model_and_tokenizer

    torch.manual_seed(0)
    model, _ = load_model_and_tokenizer(
        ModelConfig(name_or_path=str(TINY / "model"), random_init=True), dtype=torch.float64
    )
    hydra = HydraModel(model, 2)
    hydra.attach_reward_branch(load_reward_branch(hydra, trainer.checkpoint_path))
    assert hydra.reward_branch.pooling == pooling
    pad = trainer.tokenizer.pad_token_id
    # Prompts left-padded, responses right-padded, in one batch (as rollout packs them) ...
    input_ids, attention_mask, _, width = pack_sequences(prompts, responses, pad)
    with torch.no_grad():
        scores = hydra.forward_hydra(input_ids, attention_mask, logprobs_from=width - 1).scores
    torch.testing.assert_close(scores, expected, atol=FLOAT64_ATOL, rtol=0)
    # ... and each row alone, with no padding at all, scores the same.
    for row in (0, 7):
        ids, mask, _, w = pack_sequences([prompts[row]], [responses[row]], pad)
        with torch.no_grad():
            alone = hydra.forward_hydra(ids, mask, logprobs_from=w - 1).scores
        torch.testing.assert_close(alone, expected[row : row + 1], atol=FLOAT64_ATOL, rtol=0)
    # Right padding of the whole sequence (prompt and response together), mean over the response.
    if pooling == "mean":
        seqs = [prompts[i] + responses[i] for i in (0, 1)]
        plen = [len(prompts[i]) for i in (0, 1)]
        length = max(map(len, seqs))
        ids = torch.tensor([s + [pad] * (length - len(s)) for s in seqs])
        mask = torch.tensor([[1] * len(s) + [0] * (length - len(s)) for s in seqs])
        branch = hydra.reward_branch
        for i in (0, 1):
            with torch.no_grad():
                split = hydra.split_hidden_states(ids[i : i + 1], mask[i : i + 1])
                got = hydra.reward_scores(split, ids[i : i + 1], mask[i : i + 1], branch, response_start=plen[i])
            torch.testing.assert_close(got, expected[i : i + 1], atol=FLOAT64_ATOL, rtol=0)
        # mean and last differ: the option changes what is read.
        branch.pooling = "last"
        with torch.no_grad():
            last = hydra.forward_hydra(input_ids, attention_mask, logprobs_from=width - 1).scores
        assert (last - expected).abs().max() > 1e-3


@pytest.mark.slow
def test_checkpoints_without_pooling_mean_last(trained, tmp_path):
    import shutil

    tmp, trainer, _ = trained
    old = tmp_path / "old"
    shutil.copytree(trainer.checkpoint_path, old)
    state = json.loads((old / "trainer_state.json").read_text())
    assert state.pop("pooling") == "last"
    (old / "trainer_state.json").write_text(json.dumps(state))
    (old / "manifest.json").unlink()  # written before manifests and the option (as tests/fixtures/legacy)
    torch.manual_seed(0)
    from hydrappo.config import ModelConfig
    from hydrappo.storage.models import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(
        ModelConfig(name_or_path=str(TINY / "model"), random_init=True), dtype=torch.float64
    )
    assert load_reward_branch(HydraModel(model, 2), old).pooling == "last"


def test_pooling_option_is_checked(tmp_path):
    from hydrappo.config import ConfigError

    with pytest.raises(ConfigError, match="train.pooling.*last, mean"):
        reward_config(tmp_path, pooling="max")


def test_value_head_from_the_reward_head_is_its_linear_map():
    from hydrappo.model.heads import RewardHead, ValueHead

    head = RewardHead(3)
    with torch.no_grad():
        head.score.weight.copy_(torch.tensor([[1.0, -2.0, 0.5]]))
        head.score.bias.fill_(0.25)
    value = ValueHead(3)
    value.init_from_reward_head(head)
    # V(h) = w.h + b: 1*2 - 2*(-1) + 0.5*4 + 0.25 = 6.25 and 1*(-3) - 2*0 + 0.5*(-2) + 0.25 = -3.75
    hidden = torch.tensor([[2.0, -1.0, 4.0], [-3.0, 0.0, -2.0]])
    assert value(hidden).tolist() == [6.25, -3.75]
    assert value.mlp[0].weight.tolist() == [[1, 0, 0], [0, 1, 0], [0, 0, 1], [-1, 0, 0], [0, -1, 0], [0, 0, -1]]
    assert value.mlp[2].weight.tolist() == [[1.0, -2.0, 0.5, -1.0, 2.0, -0.5]] and value.mlp[2].bias.item() == 0.25
    with pytest.raises(ValueError, match="expansion 2"):
        ValueHead(3, expansion=1).init_from_reward_head(head)


@pytest.mark.slow
def test_ppo_value_head_starts_from_the_reward_head(trained, tmp_path):
    tmp, trainer, _ = trained
    from hydrappo.config import ConfigError

    with pytest.raises(ConfigError, match="model.value_head_init='reward_head'.*reward_branch_path"):
        parse_config(TINY / "config.yaml", ["--output_dir", str(tmp_path / "x"), "--value_head_init", "reward_head"])
    config = parse_config(
        TINY / "config.yaml",
        [
            "--output_dir",
            str(tmp_path / "ppo"),
            "--no_progress_bar",
            "--reward_branch_path",
            str(tmp / "reward"),
            "--value_head_init",
            "reward_head",
            "--num_layers_unfrozen",
            "2",
            "--dtype",
            "float64",
        ],
    )
    ppo = PPOTrainer(config, config_dir=TINY)
    # In float64: V(h) = w.relu(h) - w.relu(-h) + b sums other terms than w.h + b (tests/helpers/tiny.py: FLOAT64_ATOL).
    hidden = torch.randn(4, ppo.hydra.value_head.hidden_size, dtype=torch.float64)
    torch.testing.assert_close(
        ppo.hydra.value_head(hidden), ppo.hydra.reward_branch.head(hidden), atol=FLOAT64_ATOL, rtol=0
    )


def test_a_bands_reward_branch_trains_from_the_split_to_the_top_and_fits_any_split_there(tmp_path):
    """model.trainable_layers 1:3 of 4: the reward stage trains a branch of layers 1..3 (the band
    and the layer above it); it scores alike on a fresh hydra split at layer 1 (another band, or the
    top 3), and a hydra split elsewhere refuses it, naming the options that would fit."""
    reward_config(tmp_path, dtype="float64", epochs=1)
    config = parse_config(tmp_path / "reward.yaml", ["--trainable_layers", "1:3"], config_cls=RewardConfig)
    trainer = RewardTrainer(config, config_dir=tmp_path)
    trainer.train()
    assert len(trainer.branch.layers) == 3
    pairs = trainer.eval_pairs
    prompts, responses = pairs.prompt_ids[:6] * 2, pairs.chosen_ids[:6] + pairs.rejected_ids[:6]
    expected = trainer.score(prompts, responses)
    input_ids, attention_mask, _, _ = pack_sequences(prompts, responses, trainer.tokenizer.pad_token_id)

    from hydrappo.config import ModelConfig
    from hydrappo.storage.models import load_model_and_tokenizer

    def trunk():
        torch.manual_seed(0)
        return load_model_and_tokenizer(
            ModelConfig(name_or_path=str(TINY / "model"), random_init=True), dtype=torch.float64
        )[0]

    for split in ({"trainable_layers": "1:2"}, {"num_layers_unfrozen": 3}):
        hydra = HydraModel(trunk(), **split)
        hydra.attach_reward_branch(load_reward_branch(hydra, tmp_path / "reward"))
        with torch.no_grad():
            scores = hydra.forward_hydra(input_ids, attention_mask).scores
        torch.testing.assert_close(scores, expected, atol=FLOAT64_ATOL, rtol=0)
    with pytest.raises(CheckpointError, match="num_layers_unfrozen: 3 .*trainable_layers band starting at layer 1"):
        load_reward_branch(HydraModel(trunk(), 2), tmp_path / "reward")
