"""The PPO step as an object (train/ppo/step.py): built from small objects, with everything it reads
passed to its constructor, and run without a PPOTrainer. What it owns (the score moments, the
minibatch shuffle generator) it creates, and its state_dict carries them."""

import torch

from hydrappo.algo.kl import build_kl_controller
from hydrappo.config import parse_config
from hydrappo.data import PromptSampler, tokenize_prompts
from hydrappo.generation.samplers import build_sampler
from hydrappo.rewards import FunctionReward, RewardContext, RewardSources
from hydrappo.storage.models import build_hydra
from hydrappo.train.harness import Harness
from hydrappo.train.memory import BackOff
from hydrappo.train.ppo.step import PPOStep

from runs import TINY


def words(prompts, completions, **kwargs):
    return [float(len(text.split())) for text in completions]


def echo_length(prompts, completions, **kwargs):
    return [float(len(text)) for text in completions]


def small_step(tmp_path) -> PPOStep:
    config = parse_config(
        TINY / "config.yaml",
        ["--output_dir", str(tmp_path / "run"), "--batch_size", "8", "--mini_batch_size", "4", "--max_new_tokens", "4"],
    )
    config.resolve_paths(TINY)
    torch.manual_seed(config.train.seed)
    harness = Harness(config.train, config)
    hydra, tokenizer = build_hydra(config.model, device=harness.device)
    harness.setup_optimizer(hydra.trainable_parameters(), config.ppo, total_updates=10)
    rows = [f"n{i}" for i in range(6)]
    prompts = tokenize_prompts(rows, tokenizer, 16, apply_chat_template=False, system_prompt=None)
    return PPOStep(
        hydra=hydra,
        tokenizer=tokenizer,
        config=config,
        harness=harness,
        prompts=prompts,
        prompt_rows=rows,
        columns={},
        sampler=PromptSampler(len(rows), seed=0),
        rollout_sampler=build_sampler(config.generation, hydra, tokenizer),
        records_split=True,
        rewards=RewardSources([("words", 1.0, FunctionReward(words)), ("length", 0.5, FunctionReward(echo_length))]),
        reward_context=RewardContext(max_steps=10),
        agent=None,
        kl_controller=build_kl_controller("fixed", 0.01),
        backoff=BackOff(0),
    )


def test_the_step_runs_from_what_its_constructor_received(tmp_path):
    step = small_step(tmp_path)
    before = [p.detach().clone() for p in step.hydra.trainable_parameters()]
    stats, samples = step.run()
    assert len(samples) == 8 and stats["ppo/updates"] == 2 * step.config.ppo.ppo_epochs
    # each source's own mean, and the total as their weighted sum, from what scoring returned: word counts
    # and lengths are small whole numbers, so the sums, halves and means of 8 of them are exact in floating point
    assert stats["env/reward_mean"] == stats["env/reward/words"] + 0.5 * stats["env/reward/length"]
    assert any(not torch.equal(a, b) for a, b in zip(before, step.hydra.trainable_parameters()))


def test_the_step_declares_every_attribute_it_reads(tmp_path):
    """Every `self.<name>` the step's methods read is set by its constructor or is one of its own
    methods or properties: no attribute is left for a trainer (or another stage) to set."""
    import ast
    import inspect

    from hydrappo.train.ppo import step as module

    step = small_step(tmp_path)
    tree = ast.parse(inspect.getsource(module.PPOStep))
    read = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
    }
    assert read <= set(vars(step)) | set(dir(module.PPOStep)), sorted(read - set(vars(step)) - set(dir(module.PPOStep)))


def test_its_state_dict_carries_what_it_owns(tmp_path):
    first = small_step(tmp_path)
    first.run()
    state = first.state_dict()
    second = small_step(tmp_path)
    second.load_state_dict(state)
    assert torch.equal(second.shuffle_generator.get_state(), first.shuffle_generator.get_state())
    assert second.score_moments.state_dict() == first.score_moments.state_dict()
    assert second.sampler.state_dict() == first.sampler.state_dict()
