import subprocess
import sys

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model

from hydrappo import HydraModel
from hydrappo.errors import UsageError

from runs import ROOT
from tiny import FLOAT64_ATOL, left_padded_batch, tiny64

ROWS = [list(range(5, 19)), [20, 21, 22, 23, 24], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39]]


def lora(**overrides):
    return LoraConfig(**{"r": 4, "lora_alpha": 8, "target_modules": "all-linear", **overrides})


def unpadded_logprobs(model, row):
    logits = model(torch.tensor([row])).logits[0, :-1]
    return logits.log_softmax(-1).gather(-1, torch.tensor(row[1:])[:, None])[:, 0]


def train_steps(hydra, ids, mask, steps=3):
    optimizer = torch.optim.Adam(hydra.trainable_parameters(), lr=0.05)
    for _ in range(steps):
        out = hydra.forward_hydra(ids, mask)
        advantages = torch.linspace(-1, 1, out.logprobs.shape[1]).expand_as(out.logprobs)
        loss = -(advantages * out.logprobs).mean() + 0.1 * out.values.pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("layers", ["top", "all"])
def test_lora_reference_is_the_base_model_and_only_adapters_train(family, layers):
    model = tiny64(family)
    base_params = sum(p.numel() for p in model.parameters())
    hydra = HydraModel(model, num_layers_unfrozen=2, lora=lora(), lora_layers=layers)
    assert len(hydra.ref_layers) == 0 and hydra.reference_model is None  # nothing copied
    lora_params = sum(p.numel() for n, p in hydra.named_parameters() if "lora_" in n)
    value_head = sum(p.numel() for p in hydra.value_head.parameters())
    assert sum(p.numel() for p in hydra.parameters()) == base_params + lora_params + value_head

    adapted_layers = {
        int(n.split(".")[3 if family == "llama" else 3]) for n, _ in hydra.named_parameters() if "lora_" in n
    }
    assert adapted_layers == ({2, 3} if layers == "top" else {0, 1, 2, 3})

    ids, mask = left_padded_batch(ROWS)
    out = hydra.forward_hydra(ids, mask)
    assert torch.equal(out.ref_logprobs, out.logprobs)

    out = hydra.forward_hydra(ids, mask)
    (out.logprobs.mean() + out.values.mean()).backward()
    for name, param in hydra.named_parameters():
        trains = "lora_" in name or name.startswith("value_head.")
        assert param.requires_grad == trains and (param.grad is not None) == trains, name
    hydra.zero_grad()

    train_steps(hydra, ids, mask)
    after = hydra.forward_hydra(ids, mask)
    assert (after.logprobs - out.logprobs).abs().max() > 1e-3
    original = tiny64(family)
    for i, row in enumerate(ROWS):
        expected = unpadded_logprobs(original, row)
        got = after.ref_logprobs[i, ids.shape[1] - len(row) :]
        torch.testing.assert_close(got, expected, atol=FLOAT64_ATOL, rtol=0)
    top = hydra.forward_top(after.split_hidden, ids, mask)
    torch.testing.assert_close(top.logprobs, after.logprobs, atol=FLOAT64_ATOL, rtol=0)


def test_merged_model_equals_the_lora_policy():
    from hydrappo.model.lora import merged_model

    hydra = HydraModel(tiny64("llama"), num_layers_unfrozen=2, lora=lora())
    ids, mask = left_padded_batch(ROWS)
    train_steps(hydra, ids, mask)
    merged = merged_model(hydra)
    assert not any("lora" in name for name, _ in merged.named_parameters())
    policy = hydra.forward_hydra(ids, mask)
    for i, row in enumerate(ROWS):
        torch.testing.assert_close(
            policy.logprobs[i, ids.shape[1] - len(row) :], unpadded_logprobs(merged, row), atol=FLOAT64_ATOL, rtol=0
        )
    # The hydra still has its adapters.
    torch.testing.assert_close(hydra.forward_hydra(ids, mask).logprobs, policy.logprobs, atol=0, rtol=0)


@pytest.mark.slow
def test_starting_adapter_is_the_reference_not_the_bare_base(tmp_path):
    # An "SFT" adapter with non-zero weights, saved in peft's format.
    torch.manual_seed(5)
    sft = get_peft_model(tiny64("llama"), lora(init_lora_weights=False))
    sft.save_pretrained(tmp_path / "sft-adapter")
    sft_policy = PeftModel.from_pretrained(tiny64("llama"), tmp_path / "sft-adapter")
    bare = tiny64("llama")

    hydra = HydraModel(
        tiny64("llama"), num_layers_unfrozen=2, lora=lora(), lora_init_adapter=str(tmp_path / "sft-adapter")
    )
    ids, mask = left_padded_batch(ROWS)
    train_steps(hydra, ids, mask)
    out = hydra.forward_hydra(ids, mask)
    for i, row in enumerate(ROWS):
        ref = out.ref_logprobs[i, ids.shape[1] - len(row) :]
        torch.testing.assert_close(ref, unpadded_logprobs(sft_policy, row), atol=FLOAT64_ATOL, rtol=0)
        assert (ref - unpadded_logprobs(bare, row)).abs().max() > 1e-3


def test_lora_settings_errors():
    # The same words as the config check's (model/lora.py's lora_problems is the rule's one home).
    with pytest.raises(
        ValueError, match=r"model.num_layers_unfrozen=0 leaves LoRA on the top layers .* nothing to adapt"
    ):
        HydraModel(tiny64("llama"), num_layers_unfrozen=0, lora=lora())
    with pytest.raises(ValueError, match=r"model.train_lm_head=True cannot be combined with LoRA .* only adapters"):
        HydraModel(tiny64("llama"), num_layers_unfrozen=2, lora=lora(), train_lm_head=True)
    with pytest.raises(
        ValueError, match=r"lora.lora_init_adapter='adapter' needs LoRA \(lora.lora_r > 0\), which is off"
    ):
        HydraModel(tiny64("llama"), num_layers_unfrozen=2, lora_init_adapter="adapter")
    with pytest.raises(ValueError, match="lora_layers="):
        HydraModel(tiny64("llama"), num_layers_unfrozen=2, lora=lora(), lora_layers="some")
    with pytest.raises(UsageError, match="not a peft adapter folder"):
        HydraModel(tiny64("llama"), num_layers_unfrozen=2, lora=lora(), lora_init_adapter="/nonexistent")


def test_reward_branch_on_a_lora_hydra_starts_from_the_base_top_layers():
    model = tiny64("llama")
    hydra = HydraModel(model, num_layers_unfrozen=2, lora=lora())
    ids, mask = left_padded_batch(ROWS)
    train_steps(hydra, ids, mask)
    branch = hydra.new_reward_branch()
    assert not any("lora" in name for name, _ in branch.named_parameters())
    hydra.attach_reward_branch(branch)
    out = hydra.forward_hydra(ids, mask)
    original = tiny64("llama")
    for i in range(len(ROWS)):
        real = ids[i][mask[i].bool()]
        final_hidden = original(real[None], output_hidden_states=True).hidden_states[-1][0, -1]
        torch.testing.assert_close(out.scores[i], branch.head(final_hidden), atol=FLOAT64_ATOL, rtol=0)


@pytest.mark.slow
def test_lora_ppo_run_saves_a_peft_adapter_that_loads_and_merges(tmp_path):
    from hydrappo.config import parse_config
    from hydrappo.train.ppo import PPOTrainer

    tiny = ROOT / "examples" / "tiny"
    args = [
        "--output_dir",
        str(tmp_path / "run"),
        "--no_progress_bar",
        "--total_steps",
        "2",
        "--save_every",
        "1",
        "--batch_size",
        "8",
        "--mini_batch_size",
        "4",
        "--lora_r",
        "4",
        "--train_lm_head",
        "false",
        "--dtype",
        "float64",
    ]  # compared with plain peft and a merged model within FLOAT64_ATOL
    straight = PPOTrainer(parse_config(tiny / "config.yaml", args), config_dir=tiny)
    straight.train()
    checkpoint = tmp_path / "run" / "checkpoint-2"
    assert (checkpoint / "adapter" / "adapter_config.json").is_file()

    # The adapter loads with plain peft on the base model and gives the policy's numbers.
    base = straight.hydra.model
    ids, mask = left_padded_batch(ROWS[:1])
    ids = ids.clamp(max=50)
    policy = straight.hydra.forward_hydra(ids, mask).logprobs
    torch.manual_seed(0)  # the tiny example's random base, rebuilt from its seed
    from hydrappo.storage.models import load_model_and_tokenizer

    fresh, _ = load_model_and_tokenizer(straight.config.model, dtype=torch.float64)
    peft_policy = PeftModel.from_pretrained(fresh, checkpoint / "adapter")
    assert policy.dtype == torch.float64
    torch.testing.assert_close(policy[0], unpadded_logprobs(peft_policy, ids[0].tolist()), atol=FLOAT64_ATOL, rtol=0)
    del base

    # Exact resume of a LoRA run: tests/train/test_exact_resume.py.

    out = tmp_path / "merged"
    export = [sys.executable, "-m", "hydrappo", "export", str(checkpoint), "--out", str(out)]
    result = subprocess.run(export, capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float64)
    torch.testing.assert_close(policy[0], unpadded_logprobs(merged, ids[0].tolist()), atol=FLOAT64_ATOL, rtol=0)
    again = subprocess.run(export, capture_output=True, text=True, cwd=ROOT)
    assert again.returncode == 2 and "not empty" in again.stderr
