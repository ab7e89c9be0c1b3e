"""The serving-engine sampler (hydrappo/generation/serving.py) on the CPU, with a fake engine behind the
seam in place of vLLM: what is pushed (names and values), when (every weight once, then the
trained ones once per update, nothing when nothing changed), responses in generate's form, the
config's refusals, and PPO steps through the trainer.

The fake builds its model from the policy's config with every weight NaN, as vLLM builds an
empty one (`load_format="dummy"`), and loads only what is pushed; it samples with that model.
A weight that was not pushed, or pushed wrong, shows in its responses, which the tests compare
with generate's on the policy itself (greedy, in float64, as tests/generation/test_samplers.py does)."""

import copy

import pytest
import torch
from peft import LoraConfig
from transformers import AutoModelForCausalLM, GenerationConfig

from hydrappo import HydraModel
from hydrappo.config import ConfigError, GenerationArgs, parse_config, train_checks
from hydrappo.errors import UsageError
from hydrappo.generation import serving
from hydrappo.generation.samplers import GenerateSampler, Sampler, build_sampler
from hydrappo.generation.serving import EngineRequest, ServingEngineSampler
from hydrappo.model.lora import merged_model

from recorded import float64_hydra, prompts_of, stop_string_case
from runs import TINY, tiny_trainer
from tiny import FLOAT64_ATOL, VOCAB, tiny64, tiny_model, tiny_tokenizer


class FakeEngine:
    """Records every push (name -> a copy of the tensor) and every request; samples one row at a
    time with its own model, seeded by the row's seed, stop strings left to the sampler."""

    def __init__(self, hydra):
        dtype = next(hydra.model.parameters()).dtype
        self.model = AutoModelForCausalLM.from_config(copy.deepcopy(hydra.model.config)).to(dtype).eval()
        with torch.no_grad():
            for param in self.model.parameters():
                param.fill_(float("nan"))
        self.pushes: list[dict[str, torch.Tensor]] = []
        self.requests: list[EngineRequest] = []

    def load_weights(self, weights):
        pushed = {name: tensor.detach().clone() for name, tensor in weights}
        state = self.model.state_dict()
        assert set(pushed) <= set(state), f"names the engine's model does not have: {sorted(set(pushed) - set(state))}"
        with torch.no_grad():
            for name, tensor in pushed.items():
                state[name].copy_(tensor)
        self.pushes.append(pushed)

    @torch.no_grad()
    def generate(self, requests):
        self.requests.extend(requests)
        outputs = []
        for r in requests:
            sampling = {"temperature": r.temperature, "top_p": r.top_p, "top_k": r.top_k} if r.temperature > 0 else {}
            config = GenerationConfig(
                do_sample=r.temperature > 0,
                **sampling,
                max_new_tokens=r.max_new_tokens,
                min_new_tokens=r.min_new_tokens,
                eos_token_id=list(r.stop_token_ids),
                pad_token_id=0,
            )
            with torch.random.fork_rng():
                if r.seed is not None:
                    torch.manual_seed(r.seed)
                ids = self.model.generate(torch.tensor([r.prompt_ids]), generation_config=config)
            outputs.append(ids[0, len(r.prompt_ids) :].tolist())
        return outputs


def update(hydra, scale=0.3, seed=1):
    """What an optimizer step does to the policy: every trainable parameter moves, in place."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in hydra.trainable_parameters():
            param.add_(torch.randn(param.shape, generator=generator, dtype=param.dtype) * scale)


def test_every_weight_is_loaded_once_then_only_the_trained_ones_once_per_update():
    hydra = HydraModel(tiny_model("llama"), num_layers_unfrozen=1)
    engine = FakeEngine(hydra)
    sampler = ServingEngineSampler(hydra, tiny_tokenizer(), engine)
    prompts, args = prompts_of([3, 5]), GenerationArgs(max_new_tokens=4)
    assert engine.pushes == []  # built, nothing pushed until it samples
    everything = dict(hydra.model.named_parameters())

    sampler.sample(prompts, args)
    assert len(engine.pushes) == 1 and set(engine.pushes[0]) == set(everything)  # the frozen trunk, once
    sampler.sample(prompts, args)
    assert len(engine.pushes) == 1  # nothing changed: nothing pushed

    update(hydra)
    sampler.weights_changed()
    sampler.weights_changed()  # two signals before a sample: still one push
    sampler.sample(prompts, args)
    top = {name for name in everything if name.startswith("model.layers.3.")}
    assert len(engine.pushes) == 2 and top and set(engine.pushes[1]) == top
    for name, tensor in engine.pushes[1].items():
        assert torch.equal(tensor, everything[name])  # the policy's weights after the update
    sampler.sample(prompts, args)
    assert len(engine.pushes) == 2
    # Never the value head, the reference copy or a reward branch: they are not in the engine's model.
    assert not any(name.startswith(("value_head", "ref_", "reward")) for push in engine.pushes for name in push)


def test_a_trained_head_and_final_norm_are_pushed_and_the_engines_lm_head_is_its_own():
    hydra = HydraModel(tiny_model("llama"), num_layers_unfrozen=2, train_lm_head=True, train_final_norm=True)
    engine = FakeEngine(hydra)
    sampler = ServingEngineSampler(hydra, tiny_tokenizer(), engine)
    sampler.sample(prompts_of([4]), GenerationArgs(max_new_tokens=2))
    update(hydra)
    sampler.weights_changed()
    sampler.sample(prompts_of([4]), GenerationArgs(max_new_tokens=2))
    pushed = set(engine.pushes[1])
    assert {"lm_head.weight", "model.norm.weight"} <= pushed
    assert {name.split(".")[2] for name in pushed if name.startswith("model.layers.")} == {"2", "3"}
    assert "model.embed_tokens.weight" not in pushed
    # The tiny Llama ties its head to the embeddings; the hydra untied it to train it, and the
    # engine's model (built from the hydra's config) has its own, which now holds the trained one.
    fake = engine.model
    assert not torch.equal(fake.lm_head.weight, fake.model.embed_tokens.weight)
    for name, tensor in hydra.model.state_dict().items():
        assert torch.equal(fake.state_dict()[name], tensor), name


def test_lora_pushes_the_merged_weights_of_the_adapted_layers_only():
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    # In float64: W + s * B @ A merged by the sampler and by peft may sum in other orders (tests/helpers/tiny.py: FLOAT64_ATOL).
    hydra = HydraModel(tiny64("llama"), num_layers_unfrozen=1, lora=lora)
    engine = FakeEngine(hydra)
    sampler = ServingEngineSampler(hydra, tiny_tokenizer(), engine)
    sampler.sample(prompts_of([4]), GenerationArgs(max_new_tokens=2))
    plain = {name for name, _ in tiny_model("llama").named_parameters()}
    assert set(engine.pushes[0]) == plain  # plain checkpoint names: no lora_A/B, no base_layer

    update(hydra)  # lora_B starts at zero; now the adapters change the layers
    sampler.weights_changed()
    sampler.sample(prompts_of([4]), GenerationArgs(max_new_tokens=2))
    adapted = {"model.layers.3.self_attn.q_proj.weight", "model.layers.3.self_attn.v_proj.weight"}
    assert set(engine.pushes[1]) == adapted
    merged = merged_model(hydra).state_dict()  # peft's own merge, of a copy
    for name in adapted:
        base = hydra.model.get_submodule(name.removesuffix(".weight")).get_base_layer().weight
        assert engine.pushes[1][name].dtype == torch.float64
        assert torch.allclose(engine.pushes[1][name], merged[name], atol=FLOAT64_ATOL, rtol=0)
        assert not torch.allclose(engine.pushes[1][name], base)


def test_greedy_responses_are_generates_before_and_after_an_update():
    tokenizer = tiny_tokenizer()
    hydra = float64_hydra(eos_boost=2)  # some rows end early, others run to the limit
    prompts = prompts_of([3, 7, 5, 9, 4, 6, 8, 2])
    args = GenerationArgs(max_new_tokens=10, generation_batch_size=3, stop_token_ids=[11])
    served = ServingEngineSampler(hydra, tokenizer, FakeEngine(hydra))
    before = GenerateSampler(hydra, tokenizer).sample(prompts, args, greedy=True)
    got = served.sample(prompts, args, greedy=True)
    assert (got.response_ids, got.ended, got.prompt_ids) == (before.response_ids, before.ended, prompts)
    assert got.split_hidden is None
    assert any(before.ended) and not all(before.ended)

    update(hydra)
    served.weights_changed()
    after = GenerateSampler(hydra, tokenizer).sample(prompts, args, greedy=True)
    got = served.sample(prompts, args, greedy=True)
    assert after.response_ids != before.response_ids  # the update changed the policy's answers ...
    assert (got.response_ids, got.ended) == (after.response_ids, after.ended)  # ... and the engine's


def test_stop_strings_trim_the_rows_as_generate_does():
    tokenizer = tiny_tokenizer()
    hydra = float64_hydra(seed=1)
    prompts, args = stop_string_case(hydra, tokenizer)
    plain = GenerateSampler(hydra, tokenizer).sample(prompts, args, greedy=True)
    engine = FakeEngine(hydra)
    served = ServingEngineSampler(hydra, tokenizer, engine).sample(prompts, args, greedy=True)
    assert any(plain.ended) and not all(plain.ended)
    assert (served.response_ids, served.ended) == (plain.response_ids, plain.ended)
    assert engine.requests[0].stop_strings == ("w50",)  # sent to the engine too, to stop early


def test_sampled_rows_carry_the_runs_settings_and_seeds_from_torchs_generator():
    tokenizer = tiny_tokenizer()
    hydra = HydraModel(tiny_model("llama"), num_layers_unfrozen=1)
    engine = FakeEngine(hydra)
    sampler = ServingEngineSampler(hydra, tokenizer, engine)
    args = GenerationArgs(max_new_tokens=6, min_new_tokens=1, temperature=0.7, top_p=0.9, top_k=20, stop_token_ids=[9])
    prompts = prompts_of([3, 5]) * 2  # a prompt twice: two rows, two seeds
    torch.manual_seed(0)
    first = sampler.sample(prompts, args)
    torch.manual_seed(0)
    again = sampler.sample(prompts, args)
    assert again.response_ids == first.response_ids  # a seeded run samples the same again
    request = engine.requests[0]
    assert (request.temperature, request.top_p, request.top_k) == (0.7, 0.9, 20)
    assert (request.max_new_tokens, request.min_new_tokens) == (6, 1)
    assert request.stop_token_ids == (tokenizer.eos_token_id, 9)
    seeds = [r.seed for r in engine.requests[:4]]
    assert len(set(seeds)) == 4 and seeds == [r.seed for r in engine.requests[4:]]
    for tokens, ended in zip(first.response_ids, first.ended):
        assert 1 <= len(tokens) <= 6 and all(0 <= t < VOCAB for t in tokens)
        assert ended == (tokens[-1] in (tokenizer.eos_token_id, 9))
    greedy = sampler.sample(prompts, args, greedy=True)
    assert {r.seed for r in engine.requests[-4:]} == {None} and greedy.response_ids[0] == greedy.response_ids[2]
    with pytest.raises(ValueError, match="records no split states"):
        sampler.sample(prompts, args, record_split=True)


def test_build_sampler_builds_the_engine_once_or_says_what_is_missing(monkeypatch):
    tokenizer = tiny_tokenizer()
    hydra = HydraModel(tiny_model("llama"), num_layers_unfrozen=1)
    args = GenerationArgs(sampler="vllm")
    if not (torch.cuda.is_available() and serving.importlib.util.find_spec("vllm")):
        # Here (no GPU, or no vLLM) the real path stops with a message, not a traceback.
        with pytest.raises(UsageError, match=r"pip install 'hydrappo\[vllm\]'|runs on a CUDA GPU"):
            build_sampler(args, hydra, tokenizer)
    built = []
    monkeypatch.setattr(serving, "vllm_engine", lambda h, t, a: built.append(FakeEngine(h)) or built[-1])
    sampler = build_sampler(args, hydra, tokenizer)
    assert isinstance(sampler, ServingEngineSampler) and isinstance(sampler, Sampler)
    assert sampler.engine is built[0] and sampler.name == "vllm" and not sampler.records_split


def test_the_config_refuses_what_the_engine_cannot_serve(monkeypatch):
    monkeypatch.setattr(train_checks, "_vllm_installed", lambda: False)
    with pytest.raises(ConfigError) as error:
        parse_config(
            TINY / "config.yaml",
            [
                "--sampler",
                "vllm",
                "--fsdp_trunk",
                "true",
                "--trunk_quantization",
                "int8",
                "--device",
                "cpu",
                "--output_dir",
                "/tmp/unused",
            ],
        )
    message = str(error.value)
    assert "generation.sampler='vllm' cannot serve a trunk sharded over processes (train.fsdp_trunk)" in message
    assert "generation.sampler='vllm' cannot sample from model.trunk_quantization='int8''s trunk" in message
    assert (
        "generation.sampler='vllm' runs vLLM's engine on a CUDA GPU, and this run has none (train.device=cpu)"
        in message
    )
    assert "needs vLLM, which is not installed. Run `pip install 'hydrappo[vllm]'`" in message
    with pytest.raises(ConfigError, match="generation.engine_gpu_memory=0.5 only sizes the engine of sampler: vllm"):
        parse_config(TINY / "config.yaml", ["--engine_gpu_memory", "0.5", "--output_dir", "/tmp/unused"])
    monkeypatch.setattr(train_checks, "_vllm_installed", lambda: True)
    monkeypatch.setattr(train_checks, "_cuda_available", lambda: True)
    with pytest.raises(ConfigError, match=r"generation.engine_gpu_memory=1.5 must be in \(0, 1\]"):
        parse_config(
            TINY / "config.yaml", ["--sampler", "vllm", "--engine_gpu_memory", "1.5", "--output_dir", "/tmp/unused"]
        )
    parse_config(TINY / "config.yaml", ["--sampler", "vllm", "--output_dir", "/tmp/unused"])  # with both: accepted


@pytest.fixture
def fake_vllm(monkeypatch):
    """The trainer's path to vLLM with the fake engine at its end: the checks told that vLLM and a GPU are there."""
    engines = []
    monkeypatch.setattr(
        serving, "vllm_engine", lambda hydra, tokenizer, args: engines.append(FakeEngine(hydra)) or engines[-1]
    )
    monkeypatch.setattr(train_checks, "_vllm_installed", lambda: True)
    monkeypatch.setattr(train_checks, "_cuda_available", lambda: True)
    return engines


@pytest.mark.slow
def test_ppo_steps_sample_with_the_engine_and_push_once_per_update(tmp_path, fake_vllm):
    trainer = tiny_trainer(tmp_path, "--total_steps", "2", "--save_every", "0", "--sampler", "vllm")
    assert len(fake_vllm) == 1 and trainer.eval_sampler is trainer.ppo_step.rollout_sampler  # one engine
    assert trainer.ppo_step.rollout_sampler.name == "vllm" and not trainer.ppo_step.records_split
    history = trainer.train()
    assert len(history) == 2 and history[1]["tokens/responses_len_mean"] > 0
    assert history[0]["ppo/updates"] == 16  # 4 epochs x 4 minibatches: 16 optimizer steps, one push
    engine, model = fake_vllm[0], trainer.hydra.model
    trained = {name for name, param in model.named_parameters() if param.requires_grad}
    assert trained == {
        n for n, _ in model.named_parameters() if n.startswith(("model.layers.2.", "model.layers.3.", "lm_head."))
    }
    assert len(engine.pushes) == 2
    assert set(engine.pushes[0]) == {name for name, _ in model.named_parameters()}
    assert set(engine.pushes[1]) == trained
    assert all(not torch.equal(engine.pushes[0][name], engine.pushes[1][name]) for name in trained)
    # The second step's update reaches the engine before it samples again, as the policy is now.
    trainer.ppo_step.generate([[5, 6, 7]])
    assert len(engine.pushes) == 3 and set(engine.pushes[2]) == trained
    current = dict(model.named_parameters())
    assert all(torch.equal(tensor, current[name]) for name, tensor in engine.pushes[2].items())


@pytest.mark.slow
def test_a_critic_warmup_step_pushes_nothing(tmp_path, fake_vllm):
    trainer = tiny_trainer(
        tmp_path, "--total_steps", "2", "--save_every", "0", "--sampler", "vllm", "--critic_warmup_steps", "1"
    )
    trainer.train()
    # Step 1 trained the value head alone, which the engine does not hold: step 2 sampled without a push.
    assert len(fake_vllm[0].pushes) == 1
