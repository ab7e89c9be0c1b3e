"""A quantized frozen trunk (model.trunk_quantization, bitsandbytes) and 8-bit AdamW state
(ppo.optimizer / train.optimizer: adamw8bit), on the CPU: the construction probe, the
refusals, exact resume, export and sft in full precision, and the planner's numbers."""

import json
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from transformers import AutoModelForCausalLM

from hydrappo import HydraModel
from hydrappo.cli import main as cli_main
from hydrappo.config import ConfigError, SFTConfig, parse_config, validate
from hydrappo.model.arch import UnsupportedModelError
from hydrappo.model.quantize import quantize_frozen_trunk
from hydrappo.planner.counts import count_parameters
from hydrappo.planner.plan import format_largest, plan_memory, quantized_bytes, quantized_trunk
from hydrappo.planner.presets import preset_config
from hydrappo.planner.settings import TrainingSettings
from hydrappo.storage.export import export_checkpoint
from hydrappo.storage.reward_branch import base_model_identity
from hydrappo.train.sft import SFTTrainer

from runs import TINY, tiny_trainer, write_sft_config
from tiny import tiny_model

bnb = pytest.importorskip("bitsandbytes", reason="pip install 'hydrappo[quant]' (the README's test command does)")

QUANTIZED = {"int8": bnb.nn.Linear8bitLt, "4bit": bnb.nn.Linear4bit}
# Bounds of the mean |delta log-prob| of a tiny random model's tokens, quantized against unquantized
# (measured here: int8 0.0007 to 0.002; 4bit 0.025 to 0.16, NF4 of 32- and 64-wide random matrices);
# the README's table has the numbers of real models.
DRIFT = {"int8": 0.01, "4bit": 0.3}


def _ids(batch=3, length=12, vocab=96):
    ids = torch.randint(4, vocab, (batch, length), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding
    return ids, mask


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["int8", "4bit"])
def test_quantized_trunk_passes_the_probe_and_keeps_the_top_in_full_precision(mode):
    original = HydraModel(tiny_model("llama", tie_word_embeddings=False), 2)
    hydra = HydraModel(tiny_model("llama", tie_word_embeddings=False), 2, verify=False)
    report = quantize_frozen_trunk(hydra, mode)
    assert hydra.trunk_quantization == mode and report["embeddings"] and report["linears"] == 14
    assert report["bytes_after"] < report["bytes_before"] / 2

    layers = hydra.model.model.layers
    for index, layer in enumerate(layers):
        linears = [m for m in layer.modules() if isinstance(m, nn.Linear)]
        kinds = {type(m) for m in linears}
        assert kinds == ({QUANTIZED[mode]} if index < 2 else {nn.Linear}), (index, kinds)
    assert type(hydra.model.model.embed_tokens) is not nn.Embedding  # frozen and untied: quantized
    full_precision = [
        *layers[2:].parameters(),
        *hydra.ref_layers.parameters(),
        *hydra.value_head.parameters(),
        hydra.model.lm_head.weight,
        *hydra.model.model.norm.parameters(),
    ]
    assert all(p.dtype == torch.float32 for p in full_precision)
    assert {id(p) for p in hydra.trainable_parameters()} == {
        id(p) for p in [*layers[2:].parameters(), *hydra.value_head.parameters()]
    }

    ids, mask = _ids()
    real = mask[:, 1:].bool()
    with torch.no_grad():
        out = hydra.forward_hydra(ids, mask, return_logits=True)
        own = hydra.model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
        top = hydra.forward_top(out.split_hidden, ids, mask)
        hydra.train()  # the rollout runs in eval mode, the update in train mode: the same numbers
        trained = hydra.forward_hydra(ids, mask)
        hydra.eval()
        unquantized = original.forward_hydra(ids, mask)
    # The quantized model's own logits, bit for bit: the policy pass runs the model's own decoder layers (in two
    # calls, bottom then top) and its own lm_head on the same tensors, with the position ids given here.
    # Nothing is summed in another order. (float64 is no way out: 4-bit blocks take 16/32-bit floats only.)
    assert torch.equal(out.logits[mask.bool()], own[mask.bool()])
    assert torch.equal(out.ref_logprobs, out.logprobs)  # reference == policy at initialisation
    assert torch.equal(top.logprobs, out.logprobs) and torch.equal(trained.logprobs, out.logprobs)
    drift = (out.logprobs - unquantized.logprobs)[real].abs().mean().item()
    assert 0 < drift < DRIFT[mode]
    # A reward branch recognises its trunk quantized or not: the fingerprint is of the original weights.
    identity, expected = base_model_identity(hydra), base_model_identity(original)
    assert identity.pop("trunk_fingerprint") == pytest.approx(expected.pop("trunk_fingerprint"), rel=1e-9)
    assert identity == expected
    assert hydra.state_dict()  # writable (hydrappo writes none, but peft and tools call state_dict)


def test_what_stays_unquantized_and_what_is_refused():
    tied = HydraModel(tiny_model("llama"), 2, verify=False)
    assert not quantize_frozen_trunk(tied, "int8")["embeddings"]  # tied to the lm_head: stays
    assert type(tied.model.model.embed_tokens) is nn.Embedding
    untied_by_training = HydraModel(tiny_model("llama"), 2, train_lm_head=True, verify=False)
    assert quantize_frozen_trunk(untied_by_training, "4bit")["embeddings"]
    with pytest.raises(UnsupportedModelError, match="already quantized"):
        quantize_frozen_trunk(tied, "4bit")
    with pytest.raises(UnsupportedModelError, match="frozen trunk"):
        quantize_frozen_trunk(HydraModel(tiny_model("llama"), -1), "int8")
    with pytest.raises(UnsupportedModelError, match="Conv1D"):
        quantize_frozen_trunk(HydraModel(tiny_model("gpt2"), 2), "int8")
    with pytest.raises(UnsupportedModelError, match="not one of"):
        quantize_frozen_trunk(HydraModel(tiny_model("llama"), 2), "int4")

    def config(*overrides):
        return parse_config(TINY / "config.yaml", ["--no_progress_bar", *overrides])

    for overrides, message in (
        (["--trunk_quantization", "int4"], "trunk_quantization"),
        (["--optimizer", "sgd"], "ppo.optimizer"),
        (["--trunk_quantization", "int8", "--num_layers_unfrozen", "-1"], "every layer"),
        (
            ["--trunk_quantization", "4bit", "--lora_r", "4", "--lora_layers", "all", "--train_lm_head", "false"],
            "lora_layers: top",
        ),
    ):
        with pytest.raises(ConfigError, match=message):
            cfg = config(*overrides)
            cfg.resolve_paths(TINY)
            validate(cfg)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["int8", "4bit"])
def test_export_of_a_quantized_run_is_full_precision_and_close_to_the_policy(mode, tmp_path, capfd):
    # lr 0.01: the top layers move (checked below) while the drift stays the quantization's. At 0.05 one
    # step's samples decided it: 0.008 with one sampler's draws, 0.014 with another's, against 0.01.
    trainer = tiny_trainer(
        tmp_path / "run",
        "--total_steps",
        "1",
        "--batch_size",
        "8",
        "--mini_batch_size",
        "4",
        "--ppo_epochs",
        "1",
        "--learning_rate",
        "0.01",
        "--trunk_quantization",
        mode,
    )
    trainer.train()
    out = export_checkpoint(tmp_path / "run", tmp_path / "policy")
    assert json.loads((out / "hydrappo_export.json").read_text())["trained_trunk_quantization"] == mode
    written = load_file(str(out / "model.safetensors"))
    assert all(t.dtype == torch.float32 for t in written.values())

    # The bottom is the original model's (the tiny example is random-init from train.seed) ...
    reference = tiny_trainer(tmp_path / "unquantized", "--total_steps", "1")
    original = dict(reference.hydra.model.named_parameters())
    for name in (
        "model.embed_tokens.weight",
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.1.self_attn.q_proj.weight",
    ):
        assert torch.equal(written[name], original[name]), name
    # ... the top layers and the lm_head are the trained ones.
    policy = dict(trainer.hydra.model.named_parameters())
    for name in ("model.layers.3.mlp.up_proj.weight", "lm_head.weight"):
        assert torch.equal(written[name], policy[name].detach()), name
        assert not torch.equal(written[name], original[name]), name

    model = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    ids, mask = _ids(vocab=model.config.vocab_size)
    with torch.no_grad():
        expected = trainer.hydra.forward_hydra(ids, mask)
        exported = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
    logprobs = torch.log_softmax(exported[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
    real = mask[:, 1:].bool()
    drift = (logprobs - expected.logprobs)[real].abs().mean().item()
    assert drift < DRIFT[mode]  # the quantization's drift, the other way round


@pytest.mark.slow
def test_sft_on_a_quantized_trunk_writes_a_full_precision_model(tmp_path):
    config = parse_config(
        write_sft_config(tmp_path, epochs=1, optimizer="adamw8bit"), ["--trunk_quantization", "int8"], SFTConfig
    )
    trainer = SFTTrainer(config, config_dir=tmp_path)
    trainer.train()
    saved = load_file(str(tmp_path / "sft" / "model.safetensors"))
    assert all(t.dtype == torch.float32 for t in saved.values())
    torch.manual_seed(config.train.seed)
    original = AutoModelForCausalLM.from_config(
        AutoModelForCausalLM.from_pretrained(str(tmp_path / "sft")).config, dtype=torch.float32
    ).state_dict()  # the random-init base of train.seed
    assert torch.equal(saved["model.layers.0.mlp.up_proj.weight"], original["model.layers.0.mlp.up_proj.weight"])
    trained = dict(trainer.hydra.model.named_parameters())
    assert torch.equal(
        saved["model.layers.3.mlp.up_proj.weight"], trained["model.layers.3.mlp.up_proj.weight"].detach()
    )


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["int8", "4bit"])
def test_planned_quantized_bytes_are_what_bitsandbytes_stores(mode):
    hydra = HydraModel(
        tiny_model("llama", tie_word_embeddings=False, hidden_size=128, intermediate_size=256), 2, verify=False
    )
    counts = count_parameters(hydra.config)
    report = quantize_frozen_trunk(hydra, mode)
    replaced, stored = quantized_trunk(counts, 2, mode, embeddings=True)
    assert replaced * 4 == report["bytes_before"]
    assert stored == pytest.approx(report["bytes_after"], rel=1e-3 if mode == "4bit" else 0)
    settings = TrainingSettings(
        num_layers_unfrozen=2,
        dtype="float32",
        batch_size=2,
        mini_batch_size=2,
        generation_batch_size=2,
        prompt_length=4,
        response_length=4,
    )
    plans = [plan_memory(hydra.config, replace(settings, trunk_quantization=q)) for q in ("none", mode)]
    weights = [next(c.bytes for c in plan.hydra.components if c.name == "weights") for plan in plans]
    assert weights[0] - weights[1] == replaced * 4 - stored
    assert quantized_bytes(1000, 10, 1, "int8") == 1040


@pytest.mark.slow
def test_largest_plans_meet_the_consumer_gpu_targets(capsys):
    """Full top-N (N=2) of Llama-3.1-8B within 16 GB with a 4-bit trunk and 8-bit AdamW (bf16, batch
    16, 256 + 256 tokens, reward branch), within 24 GB with an int8 trunk; a 3B model within 12 GB."""
    base = TrainingSettings()
    assert (
        base.num_layers_unfrozen,
        base.dtype,
        base.batch_size,
        base.prompt_length,
        base.response_length,
        base.reward_model,
    ) == (2, "bfloat16", 16, 256, 256, True)
    llama8b, llama3b = preset_config("llama-3.1-8b"), preset_config("llama-3.2-3b")

    def plan(config, quantization, optimizer="adamw8bit"):
        settings = TrainingSettings(trunk_quantization=quantization, optimizer=optimizer)
        return plan_memory(config, settings).hydra

    assert not plan(llama8b, "none", "adamw").fits(24)
    assert plan(llama8b, "4bit").fits(16) and not plan(llama8b, "int8").fits(16)
    assert plan(llama8b, "int8").fits(24)
    assert plan(llama3b, "4bit").fits(12) and plan(llama3b, "none").fits(12)
    text = format_largest(base)
    assert "int8 trunk" in text and "4bit trunk" in text and "adamw8bit" in text
    fits16 = next(line for line in text.splitlines() if line.strip().startswith("16GB"))
    assert fits16.split()[4] == "llama-3.1-8b"  # the 4bit trunk column
    assert cli_main(["memory", "llama-3.1-8b", "--trunk-quantization", "4bit", "--optimizer", "adamw8bit"]) == 0
    out = capsys.readouterr().out
    assert "in 4bit" in out and "16GB:yes" in out
    assert cli_main(["memory", "llama-3.1-8b", "--trunk-quantization", "int3"]) == 2
    assert "invalid choice: 'int3'" in capsys.readouterr().err


@pytest.mark.slow
def test_a_reward_branch_trained_on_a_4bit_trunk_loads_onto_the_same_model_unquantized(tmp_path):
    from hydrappo.config import ModelConfig
    from hydrappo.storage.models import build_hydra
    from hydrappo.storage.reward_branch import load_reward_branch
    from hydrappo.train.reward_model import RewardTrainer
    from hydrappo.data import pack_sequences

    from runs import reward_config

    config = reward_config(tmp_path, epochs=1, optimizer="adamw8bit")
    config.model.trunk_quantization = "4bit"
    trainer = RewardTrainer(config, config_dir=tmp_path)
    trainer.train()
    assert type(trainer.hydra.model.model.layers[0].mlp.up_proj) is bnb.nn.Linear4bit
    pairs = trainer.eval_pairs
    prompts, responses = pairs.prompt_ids[:8] * 2, pairs.chosen_ids[:8] + pairs.rejected_ids[:8]
    expected = trainer.score(prompts, responses)
    for quantization in ("none", "4bit"):
        torch.manual_seed(0)  # the tiny example's random trunk
        model = ModelConfig(name_or_path=str(TINY / "model"), random_init=True, trunk_quantization=quantization)
        hydra, tokenizer = build_hydra(model)
        hydra.attach_reward_branch(load_reward_branch(hydra, tmp_path / "reward"))  # the trunk is recognised
        input_ids, attention_mask, _, _ = pack_sequences(prompts, responses, tokenizer.pad_token_id)
        with torch.no_grad():
            scores = hydra.forward_hydra(input_ids, attention_mask).scores
        if quantization == "4bit":
            torch.testing.assert_close(scores, expected, atol=1e-4, rtol=1e-4)
        else:  # the same branch on the original weights: close, not equal
            assert (scores - expected).abs().max() < 0.5 * expected.std() and not torch.equal(scores, expected)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["int8", "4bit"])
def test_experience_from_states_recorded_on_a_quantized_trunk(mode):
    """Sampling runs the same quantized bottom as the experience pass; the recorded states give
    that pass's outputs up to the kernels' batch-shape dependence (LLM.int8 picks its outlier
    columns per batch). PPO's ratio is unaffected either way: the update replays the same
    recorded states (forward_top)."""
    from recorded import both_passes, prompts_of
    from tiny import tiny_tokenizer

    hydra = HydraModel(tiny_model("llama", num_layers=4), 2)
    quantize_frozen_trunk(hydra, mode)
    _, _, mask, again, reused = both_passes(hydra, tiny_tokenizer(), prompts_of([3, 7, 5, 2]), stop_token_ids=[5, 6])
    for name in ("logprobs", "ref_logprobs", "values"):
        torch.testing.assert_close(getattr(reused, name), getattr(again, name), atol=2e-3, rtol=0, msg=name)


@pytest.mark.parametrize("mode", ["int8", "4bit"])
def test_a_band_quantizes_only_the_layers_below_it(mode):
    """Band 1:3 of 4: layer 0 quantized; the band and the frozen layer 3 above it (the update's
    backward passes through it) stay in full precision; the policy is the quantized model's own."""
    hydra = HydraModel(tiny_model("llama", tie_word_embeddings=False), trainable_layers="1:3", verify=False)
    report = quantize_frozen_trunk(hydra, mode)
    assert report["linears"] == 7  # the one layer below the band
    layers = hydra.model.model.layers
    kinds = [{type(m) for m in layer.modules() if isinstance(m, nn.Linear)} for layer in layers]
    assert kinds == [{QUANTIZED[mode]}, {nn.Linear}, {nn.Linear}, {nn.Linear}]
    assert {id(p) for p in hydra.trainable_parameters()} == {
        id(p) for p in [*layers[1:3].parameters(), *hydra.value_head.parameters()]
    }
    ids, mask = _ids()
    with torch.no_grad():
        out = hydra.forward_hydra(ids, mask, return_logits=True)
        own = hydra.model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
        top = hydra.forward_top(out.split_hidden, ids, mask)
    assert torch.equal(out.logits[mask.bool()], own[mask.bool()])
    assert torch.equal(out.ref_logprobs, out.logprobs) and torch.equal(top.logprobs, out.logprobs)
    hydra.forward_top(out.split_hidden, ids, mask).logprobs.sum().backward()
    assert all(p.grad is not None for p in layers[1:3].parameters()) and all(
        p.grad is None for p in layers[3].parameters()
    )
