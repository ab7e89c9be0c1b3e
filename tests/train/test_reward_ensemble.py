"""Several reward heads on one branch (algo/ensemble.py, model/heads.py, train/reward_model.py):
the objectives and the bootstrap-weighted loss by hand, one head unchanged, heads that differ
after training on their own resamples, standardised by their own statistics, stored with the
branch, read by PPO in the same pass, and checkpoints from before ensembles still loading."""

import json
import math
import shutil

import pytest
import torch

from hydrappo import HydraModel
from hydrappo.algo.ensemble import bootstrap_counts, ensemble_score
from hydrappo.algo.losses import preference_loss
from hydrappo.config import ConfigError, ModelConfig, parse_config
from hydrappo.model.heads import RewardHead, ValueHead
from hydrappo.rewards.models import BranchReward, ensemble_parts
from hydrappo.storage.models import load_model_and_tokenizer
from hydrappo.storage.reward_branch import load_reward_branch
from hydrappo.train.ppo import PPOTrainer
from hydrappo.train.reward_model import RewardTrainer
from hydrappo.data import pack_sequences

from runs import TINY, branch_ppo_config, reward_config
from tiny import FLOAT64_ATOL

SCORES = torch.tensor([[1.0, 3.0, 2.0], [-1.0, -1.0, -1.0], [0.0, 4.0, -4.0]], dtype=torch.float64)


def test_the_objectives_by_hand():
    assert ensemble_score(SCORES, "mean").tolist() == [2.0, -1.0, 0.0]
    assert ensemble_score(SCORES, "worst").tolist() == [1.0, -1.0, -4.0]
    # population std: sqrt(2/3), 0, sqrt(32/3)
    expected = [2.0 - 0.5 * math.sqrt(2 / 3), -1.0, -0.5 * math.sqrt(32 / 3)]
    torch.testing.assert_close(ensemble_score(SCORES, "mean_minus_std", 0.5), torch.tensor(expected).double())
    one = torch.tensor([0.5, -2.0])
    assert ensemble_score(one, "worst") is one  # one head scores as it is
    with pytest.raises(ValueError, match="the known ones: mean, worst, mean_minus_std"):
        ensemble_score(SCORES, "median")


def test_bootstrap_counts_are_seeded_poisson_and_one_head_sees_the_plain_data():
    counts = bootstrap_counts(4000, 4, seed=3)
    assert counts.shape == (4000, 4) and torch.equal(counts, bootstrap_counts(4000, 4, seed=3))
    assert not torch.equal(counts, bootstrap_counts(4000, 4, seed=4))
    assert torch.equal(counts, counts.round()) and counts.min() == 0
    # Poisson(1): mean 1, P(0) = 1/e; 16000 draws put both within 4 standard errors
    assert abs(counts.mean().item() - 1.0) < 4 * math.sqrt(1 / 16000)
    p0 = math.exp(-1)
    assert abs((counts == 0).float().mean().item() - p0) < 4 * math.sqrt(p0 * (1 - p0) / 16000)
    assert not torch.equal(counts[:, 0], counts[:, 1])  # each head its own resample
    assert torch.equal(bootstrap_counts(5, 1, seed=0), torch.ones(5, 1))


def test_the_counts_weighted_loss_of_several_heads_by_hand():
    chosen = torch.tensor([[2.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    rejected = torch.tensor([[0.0, 1.0], [0.0, -1.0]], dtype=torch.float64)
    counts = torch.tensor([[2.0, 0.0], [1.0, 3.0]])

    def softplus(x):
        return math.log1p(math.exp(x))

    # -log sigmoid(gap) = softplus(-gap); gaps [[2, -1], [0, 2]]; sum(counts * loss) / (2 pairs * 2 heads)
    loss, stats = preference_loss(chosen, rejected, counts=counts)
    assert loss.item() == pytest.approx((2 * softplus(-2) + 0 + 1 * softplus(0) + 3 * softplus(-2)) / 4)
    # The stats are those of the heads' mean (gaps 0.5 and 1), with each head's own accuracy
    assert stats["accuracy"].item() == 1.0 and stats["margin"].item() == pytest.approx(0.75)
    assert stats["head_accuracy/0"].item() == 0.75 and stats["head_accuracy/1"].item() == 0.5
    # Counts of 1 and a margin: each head's mean loss, averaged over the heads
    margin = torch.tensor([1.0, 0.0])
    loss, _ = preference_loss(chosen, rejected, margin, counts=torch.ones(2, 2))
    per_head = [preference_loss(chosen[:, k], rejected[:, k], margin)[0].item() for k in range(2)]
    assert loss.item() == pytest.approx(sum(per_head) / 2)


def test_one_head_keeps_its_weight_names_and_raw_scores():
    torch.manual_seed(0)
    head = RewardHead(8).double()
    assert set(head.state_dict()) == {"score.weight", "score.bias"}  # what checkpoints before ensembles hold
    hidden = torch.randn(5, 8, dtype=torch.float64)
    head.standardise([3.0], [2.0])  # one head stays raw
    torch.testing.assert_close(head(hidden), hidden @ head.score.weight[0] + head.score.bias[0])
    several = RewardHead(8, heads=3).double()
    assert set(several.state_dict()) == {"score.weight", "score.bias"} and several(hidden).shape == (5, 3)


def test_several_heads_answer_standardised_scores_and_the_value_head_their_mean():
    torch.manual_seed(0)
    head = RewardHead(6, heads=3).double()
    hidden = torch.randn(4, 6, dtype=torch.float64)
    raw = hidden @ head.score.weight.T + head.score.bias
    mean, std = [0.5, -1.0, 2.0], [2.0, 0.5, 4.0]
    head.standardise(mean, std)
    standardised = (raw - torch.tensor(mean).double()) / torch.tensor(std).double()
    torch.testing.assert_close(head(hidden), standardised)
    value = ValueHead(6).double()
    value.init_from_reward_head(head)  # V(h) = the mean of the standardised heads, a linear map of h
    torch.testing.assert_close(value(hidden), standardised.mean(-1))


def test_the_branch_source_scores_by_the_objective_and_logs_each_head():
    samples = ["a", "b", "c"]
    assert BranchReward("worst")(samples, branch_scores=SCORES).tolist() == [1.0, -1.0, -4.0]
    assert BranchReward()(samples, branch_scores=SCORES[:, 0]).tolist() == [1.0, -1.0, 0.0]
    parts = ensemble_parts(SCORES)
    assert sorted(parts) == [
        "reward_branch/head_0",
        "reward_branch/head_1",
        "reward_branch/head_2",
        "reward_branch/spread",
    ]
    assert parts["reward_branch/head_1"].tolist() == [3.0, -1.0, 4.0] and parts["reward_branch/spread"][1] == 0
    assert ensemble_parts(SCORES[:, 0]) == {} and ensemble_parts(None) == {}


def test_the_ensemble_options_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="train.reward_heads"):
        reward_config(tmp_path, reward_heads=0)
    with pytest.raises(ConfigError, match="ensemble_objective.*mean, worst, mean_minus_std"):
        parse_config(TINY / "config.yaml", ["--ensemble_objective", "median"])


def fresh_hydra() -> HydraModel:
    """A trunk built as the reward stage built it (random init from seed 0), in float64."""
    torch.manual_seed(0)
    model, _ = load_model_and_tokenizer(
        ModelConfig(name_or_path=str(TINY / "model"), random_init=True), dtype=torch.float64
    )
    return HydraModel(model, 2)


@pytest.fixture(scope="module")
def ensemble(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ensemble")
    trainer = RewardTrainer(reward_config(tmp, dtype="float64", reward_heads=3), config_dir=tmp)
    history = trainer.train()
    return tmp, trainer, history


@pytest.mark.slow
def test_three_heads_learn_differ_and_are_stored_with_their_statistics(ensemble):
    tmp, trainer, history = ensemble
    final = [row for row in history if "eval/accuracy" in row][-1]
    heads = [final[f"eval/head_accuracy/{k}"] for k in range(3)]
    assert final["eval/accuracy"] >= 0.85 and min(heads) >= 0.8, final
    weights = trainer.branch.head.score.weight
    assert not torch.allclose(weights[0], weights[1]) and not torch.allclose(weights[1], weights[2])

    # In a fresh trunk the branch answers the trainer's (standardised) scores of each head
    info = json.loads((trainer.checkpoint_path / "trainer_state.json").read_text())
    assert info["reward_heads"] == 3 and len(info["score_stats"]["head_score_std"]) == 3
    hydra = fresh_hydra()
    hydra.attach_reward_branch(load_reward_branch(hydra, tmp / "reward"))
    train = trainer.train_pairs
    prompts, responses = train.prompt_ids * 2, train.chosen_ids + train.rejected_ids
    expected = trainer.score(prompts, responses)
    input_ids, attention_mask, _, _ = pack_sequences(prompts, responses, trainer.tokenizer.pad_token_id)
    with torch.no_grad():
        scores = hydra.forward_hydra(input_ids, attention_mask).scores
    assert scores.shape == (len(prompts), 3)
    torch.testing.assert_close(scores, expected, atol=FLOAT64_ATOL, rtol=0)
    # standardised on the reference set (here the training texts, all of them: 2 x pairs <= stats_max_samples)
    torch.testing.assert_close(scores.mean(0), torch.zeros(3).double(), atol=1e-9, rtol=0)
    torch.testing.assert_close(scores.std(0), torch.ones(3).double(), atol=1e-9, rtol=0)
    assert info["score_mean"] == pytest.approx(0.0, abs=1e-9)  # the statistics of the heads' mean
    assert info["score_std"] == pytest.approx(scores.mean(-1).std().item(), rel=1e-9)


@pytest.mark.slow
def test_ppo_reads_the_heads_in_its_pass_and_optimises_the_worst(ensemble, tmp_path):
    tmp, _, _ = ensemble
    path = branch_ppo_config(tmp_path, tmp / "reward", {"ensemble_objective": "worst"}, total_steps=2, save_every=2)
    history = PPOTrainer(parse_config(path), config_dir=tmp_path).train()
    for row in history:
        heads = [row[f"env/reward/reward_branch/head_{k}"] for k in range(3)]
        # the worst head of each response: at most each head's, on average too
        assert row["env/reward/reward_branch"] <= min(heads) + 1e-9
        assert row["env/reward/reward_branch/spread"] > 0
        assert row["env/reward_mean"] == pytest.approx(row["env/reward/reward_branch"])


@pytest.mark.slow
def test_a_branch_written_before_ensembles_loads_as_one_head(tmp_path):
    trainer = RewardTrainer(reward_config(tmp_path, dtype="float64", max_steps=2, epochs=1), config_dir=tmp_path)
    trainer.train()
    old = tmp_path / "old"
    shutil.copytree(trainer.checkpoint_path, old)
    state = json.loads((old / "trainer_state.json").read_text())
    assert state.pop("reward_heads") == 1
    (old / "trainer_state.json").write_text(json.dumps(state))
    (old / "manifest.json").unlink()  # (as written before manifests, like tests/fixtures/legacy)
    branch = load_reward_branch(fresh_hydra(), old)
    assert branch.head.heads == 1
    torch.testing.assert_close(branch.head.score.weight, trainer.branch.head.score.weight)


@pytest.mark.slow
def test_continuing_a_branch_with_another_number_of_heads_is_refused(ensemble, tmp_path):
    """A branch of 3 heads continued as one (the default train.reward_heads) is refused before any step, by name."""
    from hydrappo.errors import UsageError

    tmp, _, _ = ensemble
    config = reward_config(tmp_path, dtype="float64")
    config.model.reward_branch_path = str(tmp / "reward")
    with pytest.raises(
        UsageError, match=r"train.reward_heads=1 differs from the branch being continued .*set train.reward_heads: 3"
    ):
        RewardTrainer(config, config_dir=tmp_path)
    assert not (tmp_path / "reward").exists()  # nothing written


@pytest.mark.slow
def test_an_ensemble_objective_on_one_head_says_it_scores_as_it_is(tmp_path, caplog):
    trainer = RewardTrainer(reward_config(tmp_path, dtype="float64", max_steps=1, epochs=1), config_dir=tmp_path)
    trainer.train()
    for objective, warned in (("worst", True), ("mean", False)):
        caplog.clear()
        (tmp_path / objective).mkdir()
        path = branch_ppo_config(tmp_path / objective, tmp_path / "reward", {"ensemble_objective": objective})
        with caplog.at_level("WARNING", logger="hydrappo"):
            PPOTrainer(parse_config(path), config_dir=path.parent)
        said = [r.getMessage() for r in caplog.records if "has one head to choose from" in r.getMessage()]
        assert bool(said) == warned, said


@pytest.mark.slow
def test_generate_scores_with_the_runs_ensemble_and_compare_says_it_cannot(ensemble, tmp_path, caplog):
    """`hydrappo generate` on a run scored by a branch of 3 heads scores both columns with that branch and the
    run's objective (the branch is data: no trust needed), as PPO scored them in training; `compare`, whose
    models do not share the run's trunk, says so and leaves them unscored."""
    from hydrappo.evaluation.compare import compare, generate

    tmp, _, _ = ensemble
    path = branch_ppo_config(tmp_path, tmp / "reward", {"ensemble_objective": "worst"}, total_steps=1, save_every=1)
    PPOTrainer(parse_config(path), config_dir=tmp_path).train()
    prompts = str(TINY / "prompts.jsonl")
    columns = generate(tmp_path, prompts, limit=4, greedy=True)
    for rows in columns.values():
        scores = [row["score"] for row in rows]
        assert all(score is not None and math.isfinite(score) for score in scores), scores
    assert list(columns) == ["base", "trained (checkpoint-1)"]
    with caplog.at_level("WARNING", logger="hydrappo"):
        compared = compare([str(tmp_path)], prompts, limit=2, greedy=True)
    assert all(row["score"] is None for rows in compared.values() for row in rows)
    assert any("a branch scores on its own run's trunk" in r.getMessage() for r in caplog.records)
