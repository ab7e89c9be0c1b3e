"""Benchmark one PPO-RLHF iteration of hydrappo against the classic four-model layout.

Both sides get the same settings and the same work: sample responses, score them with
the policy, the frozen reference, the critic and the reward model, shape rewards, GAE,
then PPO epochs of clipped-loss AdamW steps (hydrappo.algo's functions on both sides).

  hydrappo  the trainer itself: a PPOTrainer built in this process around one HydraModel
            of the benchmark's model (frozen shared bottom, top N layers train, a frozen
            copy of them is the reference, an MLP value head, and a frozen reward branch,
            hydra.new_reward_branch() + attach_reward_branch, that scores), timed in its
            own methods: make_experience (its sampling, `generate`, timed inside it) and
            ppo_update, which runs forward_top on the cached split hidden state.
  classic   four separate models, as TRL's PPOTrainer (v0.12+) builds them: the policy
            (every weight trains), a frozen reference copy, a value model and a frozen
            reward model, each a full copy of the base transformer with a scalar
            Linear(hidden, 1) head (AutoModelForSequenceClassification-like). The value
            model trains. Responses come from the same generate_responses; log-probs use
            the same chunked, response-only hydrappo.logprobs.token_logprobs, so that
            the layouts, not the log-prob code, are compared.

Measured (timing side by side in ONE process, repetitions interleaved, medians):
  1. one PPO iteration (rollout + experience + PPO epochs): time, per phase, ratio;
     peak resident memory of each layout in its own spawned child process
     (ru_maxrss after the run minus ru_maxrss after imports); parameter, gradient and
     AdamW-state bytes.
  2. generation throughput: the trainer's generate (generate_responses on the hydra) against
     plain model.generate on the unwrapped model with the same GenerationConfig (target
     ratio >= 0.95).
  3. the update phase: the trainer's ppo_update (forward_top on the cached split hidden state)
     against the same update recomputing the whole trunk for every mini-batch
     (forward_hydra with return_reference=False in place of forward_top) (target ratio <= 0.35).

Responses always have exactly --new-tokens tokens (min_new_tokens = max_new_tokens),
so both sides process the same number of tokens.

    python tools/lab/bench_ppo.py                        # SmolLM2-135M-shaped Llama, random weights
    python tools/lab/bench_ppo.py --num-layers 6 --repeats 2   # quick run
    python tools/lab/bench_ppo.py --model PATH           # a local model directory
    python tools/lab/bench_ppo.py --skip-memory          # timing only
"""

from __future__ import annotations

import argparse
import copy
import multiprocessing
import resource
import shlex
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path


# ---------------------------------------------------------------------------- options
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="a preset name or a local model directory")
    parser.add_argument("--num-layers", type=int, default=None, help="keep only the first L decoder layers")
    parser.add_argument("--num-layers-unfrozen", type=int, default=2, help="hydrappo's N")
    parser.add_argument("--batch", type=int, default=8, help="prompts per PPO iteration")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument(
        "--samples-per-prompt", type=int, default=1, help="G: each prompt in G consecutive rows of the batch"
    )
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--ppo-epochs", type=int, default=4)
    parser.add_argument("--mini-batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="timed repetitions (after one warm-up)")
    parser.add_argument("--memory-iterations", type=int, default=1, help="PPO iterations per memory child")
    parser.add_argument("--skip-memory", action="store_true", help="no peak-memory child processes")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    parser.add_argument(
        "--compare-reuse",
        action="store_true",
        help="instead of the classic comparison: hydrappo with the experience pass on the split hidden states "
        "recorded while sampling and one prefill per distinct prompt (generation.reuse_trunk_pass and "
        "share_prompt_prefill, the defaults) against both off (the whole trunk again, a prefill per row)",
    )
    parser.add_argument(
        "--no-reward-branch",
        action="store_true",
        help="with --compare-reuse: score with a fixed function instead of a reward branch, as the main job's "
        "reward function does (the last sampled token's state is then never needed)",
    )
    parser.add_argument(
        "--lora-rank",
        type=int,
        default=0,
        help="instead of the classic comparison: full top-N training against LoRA of this rank on the top N "
        "layers and on all layers (bytes and time per PPO iteration)",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    parse_args()  # --help and a wrong option answer here, before torch and hydrappo load below

import torch  # noqa: E402
import transformers  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hydrappo import HydraModel  # noqa: E402
from hydrappo.algo.advantages import gae  # noqa: E402
from hydrappo.algo.losses import PolicyTokens, PPOLossSettings, ppo_loss  # noqa: E402
from hydrappo.algo.masked import whiten  # noqa: E402
from hydrappo.algo.scores import shape_rewards  # noqa: E402
from hydrappo.config import Config, DataArgs, GenerationArgs, ModelConfig, PPOArgs, RewardArgs, TrainArgs  # noqa: E402
from hydrappo.data import left_pad  # noqa: E402
from hydrappo.generation.responses import generate_responses, generation_config  # noqa: E402
from hydrappo.model.arch import locate, logits_transform, output_embeddings  # noqa: E402
from hydrappo.model.hydra import disable_dropout  # noqa: E402
from hydrappo.model.logprobs import token_logprobs  # noqa: E402
from hydrappo.model.split import last_token_index, position_ids_from_mask  # noqa: E402
from hydrappo.planner.counts import unique_bytes  # noqa: E402
from hydrappo.planner.presets import PRESETS, preset_config  # noqa: E402
from hydrappo.planner.tokenizer import tokenizer_for_vocab  # noqa: E402
from hydrappo.rewards import build_reward_source  # noqa: E402
from hydrappo.train.ppo.experience import Experience  # noqa: E402
from hydrappo.train.ppo import PPOTrainer  # noqa: E402
from hydrappo.data import pack_sequences  # noqa: E402

MIB = 2**20
PPO = PPOArgs()  # the library's defaults: clip ranges, vf_coef, KL coefficient, GAE, AdamW


# ---------------------------------------------------------------------------- setup
def configure(args) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


def model_config(args):
    overrides = {} if args.num_layers is None else {"num_hidden_layers": args.num_layers}
    if args.model.lower() in PRESETS:
        return preset_config(args.model, **overrides)
    return transformers.AutoConfig.from_pretrained(args.model, **overrides)


def build_base_model(args) -> nn.Module:
    """The base causal LM, float32, dropout off. Presets get seeded random weights."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = model_config(args)
    if args.model.lower() in PRESETS:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(args.model, config=config, dtype=torch.float32)
    disable_dropout(model)
    return model.eval()


@dataclass
class BenchTokenizer:
    """All generate_responses needs of a tokenizer when there are no stop strings."""

    eos_token_id: int
    pad_token_id: int


def bench_tokenizer(model) -> BenchTokenizer:
    eos = model.config.eos_token_id
    eos = (eos[0] if isinstance(eos, (list, tuple)) else eos) if eos is not None else 0
    return BenchTokenizer(eos_token_id=eos, pad_token_id=eos)  # pad == EOS, as in SmolLM2


def make_prompts(args, vocab_size: int) -> list[list[int]]:
    """`batch` rows: batch / G distinct random prompts, each in G consecutive rows."""
    generator = torch.Generator().manual_seed(1)
    group = args.samples_per_prompt
    distinct = torch.randint(3, vocab_size, (args.batch // group, args.prompt_len), generator=generator).tolist()
    return [prompt for prompt in distinct for _ in range(group)]


def generation_args(args) -> GenerationArgs:
    # Sampling, and the log-probs the trainer takes, at the tool's temperature (tools that set none: 1).
    return GenerationArgs(
        max_new_tokens=args.new_tokens,
        min_new_tokens=args.new_tokens,
        generation_batch_size=args.batch,
        temperature=getattr(args, "temperature", 1.0),
    )


# ---------------------------------------------------------------------------- the classic layout's PPO pieces
# (hydrappo's side runs the trainer's own step: PPOStep.make_experience and ppo_update.)
def advantages_of(scores, logprobs, ref_logprobs, values, action_mask):
    """Shaped rewards (KL in the reward), GAE and whitened advantages, as the trainer does."""
    rewards, _ = shape_rewards(
        scores, logprobs, ref_logprobs, action_mask, PPO.init_kl_coef, kl_estimator=PPO.kl_estimator
    )
    advantages, returns = gae(rewards, values, action_mask, PPO.gamma, PPO.lam)
    return rewards, whiten(advantages, action_mask), returns


def make_optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        params,
        lr=PPO.learning_rate,
        betas=(PPO.adam_beta1, PPO.adam_beta2),
        eps=PPO.adam_eps,
        weight_decay=PPO.weight_decay,
    )


def ppo_epochs(experience: Experience, forward, params, optimizer, ppo_epochs: int, mini_batch: int) -> None:
    """PPO epochs x shuffled mini-batches: `forward(batch)` -> (logprobs, values), both
    response-aligned (B, R); clipped loss, backward, gradient clipping, AdamW step."""
    size = experience.input_ids.shape[0]
    generator = torch.Generator().manual_seed(2)
    for _ in range(ppo_epochs):
        order = torch.randperm(size, generator=generator)
        for start in range(0, size, mini_batch):
            batch = experience.minibatch(order[start : start + mini_batch])
            logprobs, values = forward(batch)
            settings = PPOLossSettings(
                cliprange=PPO.cliprange, cliprange_value=PPO.cliprange_value, vf_coef=PPO.vf_coef
            )
            loss, _ = ppo_loss(PolicyTokens(logprobs, values=values), batch.sampled_tokens(), settings)
            loss.backward()
            nn.utils.clip_grad_norm_(params, PPO.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


def optimizer_state_bytes(optimizer) -> int:
    return unique_bytes(v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v))


class Layout:
    """One way of holding policy, reference, critic and reward model. Subclasses define
    rollout(), modules(), params and optimizer, and either make_experience(responses) and
    update(experience), which iteration() times, or an iteration() of their own."""

    def __init__(self, args):
        self.args = args
        self.gen_args = generation_args(args)

    def iteration(self) -> dict[str, float]:
        """One PPO iteration; returns the seconds of each phase."""
        times = {}
        start = time.perf_counter()
        responses = self.rollout()
        times["generate"] = time.perf_counter() - start
        experience = self.make_experience(responses)
        times["experience"] = time.perf_counter() - start - times["generate"]
        self.update(experience)
        times["update"] = time.perf_counter() - start - times["generate"] - times["experience"]
        times["total"] = time.perf_counter() - start
        return times

    def rollout(self):
        return generate_responses(self.sampler, self.tokenizer, self.prompts, self.gen_args)

    def state_bytes(self) -> dict[str, int]:
        params = [p for module in self.modules() for p in module.parameters()]
        return {
            "params": unique_bytes(params),
            "trainable": unique_bytes(self.params),  # = gradient bytes
            "adam": optimizer_state_bytes(self.optimizer),
        }


# ---------------------------------------------------------------------------- hydrappo
def fixed_scores(completions, **columns):
    """Scores without a reward branch (the LoRA comparison, --no-reward-branch): -1 .. 1 over the
    batch, the same work for every layout."""
    return torch.linspace(-1, 1, len(completions)).tolist()


def build_trainer(
    hydra: HydraModel, args, prompts: list[list[int]], reward_branch: bool, reuse_trunk: bool
) -> PPOTrainer:
    """A PPOTrainer around `hydra` with the benchmark's settings (the library's defaults for the
    rest), on the CPU in float32. Its prompt table holds each distinct prompt of `prompts` once (it
    samples each G times itself), written in a word tokenizer whose word 'wN' is token N, so that it
    tokenizes back to the same ids. `reward_branch`: the attached branch scores, as
    reward.use_reward_branch has it score (the branch comes from model.reward_branch_path in a run;
    here it is built in memory); else fixed_scores. `reuse_trunk`: the experience pass on the split
    states recorded while sampling, one prefill per distinct prompt (the defaults); False: neither."""
    group = args.samples_per_prompt
    generation = replace(
        generation_args(args), samples_per_prompt=group, reuse_trunk_pass=reuse_trunk, share_prompt_prefill=reuse_trunk
    )
    config = Config(
        model=ModelConfig(num_layers_unfrozen=args.num_layers_unfrozen),
        generation=generation,
        ppo=PPOArgs(batch_size=args.batch, mini_batch_size=args.mini_batch, ppo_epochs=args.ppo_epochs),
        data=DataArgs(max_prompt_length=args.prompt_len),
        # Nothing is written there: the benchmark times the step's methods, never harness.run.
        train=TrainArgs(
            output_dir=str(Path(tempfile.gettempdir()) / "bench_ppo"),
            device="cpu",
            mixed_precision="no",
            progress_bar=False,
        ),
    )
    rows = [{"prompt": " ".join(f"w{token}" for token in prompt)} for prompt in prompts[::group]]
    trainer = PPOTrainer(
        config,
        hydra=hydra,
        tokenizer=tokenizer_for_vocab(hydra.config.vocab_size),
        reward_funcs=[fixed_scores],
        train_dataset=rows,
    )
    if reward_branch:
        trainer.ppo_step.rewards = build_reward_source(RewardArgs(use_reward_branch=True))
    return trainer


class HydraLayout(Layout):
    """hydrappo: a PPOTrainer on one trunk with policy, reference, value head and reward branch,
    timed in its own methods."""

    name = "hydrappo"

    def __init__(
        self,
        base_model,
        args,
        lora=None,
        lora_layers: str = "top",
        reward_branch: bool = True,
        reuse_trunk: bool = True,
    ):
        super().__init__(args)
        self.hydra = HydraModel(
            base_model, num_layers_unfrozen=args.num_layers_unfrozen, lora=lora, lora_layers=lora_layers
        ).eval()
        if reward_branch:
            self.hydra.attach_reward_branch(self.hydra.new_reward_branch())
        self.prompts = make_prompts(args, base_model.config.vocab_size)
        self.trainer = build_trainer(self.hydra, args, self.prompts, reward_branch, reuse_trunk)
        self.tokenizer, self.gen_args = self.trainer.tokenizer, self.trainer.config.generation
        self.params, self.optimizer = self.trainer.harness.params, self.trainer.harness.optimizer
        self.generate_seconds = 0.0
        self.trainer.ppo_step.generate = self._timed(self.trainer.ppo_step.generate)

    def _timed(self, generate):
        """The trainer's sampling, its seconds kept: the generate phase inside make_experience."""

        def timed(prompt_ids):
            start = time.perf_counter()
            try:
                return generate(prompt_ids)
            finally:
                self.generate_seconds = time.perf_counter() - start

        return timed

    def modules(self):
        return [self.hydra]

    def rollout(self):
        """Sampling alone: the trainer's generate (recording the split if it does) on the benchmark's prompts."""
        return self.trainer.ppo_step.generate(self.prompts)

    def iteration(self) -> dict[str, float]:
        """One PPO step of the trainer (train_step's work, without the KL controller and the logs)."""
        trainer, plan = self.trainer, self.trainer.ppo_step.step_plan()
        start = time.perf_counter()
        experience, _, _ = trainer.ppo_step.make_experience(plan)
        made = time.perf_counter()
        trainer.ppo_step.ppo_update(experience, plan)
        end = time.perf_counter()
        generate = self.generate_seconds
        return {"generate": generate, "experience": made - start - generate, "update": end - made, "total": end - start}


@contextmanager
def whole_trunk_updates(hydra: HydraModel):
    """Within it, the update's forward_top runs the whole trunk again (forward_hydra without the
    reference and the reward branch; the frozen bottom builds no graph): an update without the cache."""
    branch = hydra.reward_branch

    def whole_trunk(split_hidden, input_ids, attention_mask=None, **options):
        return hydra.forward_hydra(input_ids, attention_mask, return_reference=False, **options)

    hydra.forward_top, hydra.reward_branch = whole_trunk, None
    try:
        yield
    finally:
        del hydra.forward_top  # the method again
        hydra.reward_branch = branch


# ---------------------------------------------------------------------------- classic four-model layout
class ScalarModel(nn.Module):
    """A value or reward model: the base transformer (a full copy) + Linear(hidden, 1),
    like AutoModelForSequenceClassification with num_labels=1, used as TRL does."""

    def __init__(self, causal_lm: nn.Module):
        super().__init__()
        arch = locate(causal_lm)
        self.backbone = copy.deepcopy(arch.decoder)
        self.score = nn.Linear(arch.hidden_size, 1, bias=False)

    def per_token(self, ids, mask) -> torch.Tensor:
        return self.score(decoder_hidden(self.backbone, ids, mask)).squeeze(-1)

    def sequence_score(self, ids, mask) -> torch.Tensor:
        values = self.per_token(ids, mask)
        return values[torch.arange(values.shape[0]), last_token_index(mask)]


def decoder_hidden(decoder, ids, mask) -> torch.Tensor:
    out = decoder(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), use_cache=False)
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def response_logprobs(model, ids, mask, offset: int, with_entropy: bool = False):
    """Log-probs (and entropy) of the response tokens under a full causal LM, (B, R)."""
    hidden = decoder_hidden(locate(model).decoder, ids, mask)
    logprobs, entropy = token_logprobs(
        hidden[:, offset:-1],
        ids[:, offset + 1 :],
        output_embeddings(model),
        logits_transform(model),
        with_entropy=with_entropy,
    )
    is_pad = mask[:, offset + 1 :] == 0
    return logprobs.masked_fill(is_pad, 0.0), entropy.masked_fill(is_pad, 0.0) if entropy is not None else None


class ClassicLayout(Layout):
    """TRL's PPOTrainer layout: policy, ref_policy, value_model, reward_model."""

    name = "classic"

    def __init__(self, base_model, args):
        super().__init__(args)
        self.policy = base_model  # every weight trains
        self.ref_policy = copy.deepcopy(base_model).requires_grad_(False)
        self.value_model = ScalarModel(base_model).eval()  # trains
        self.reward_model = ScalarModel(base_model).eval().requires_grad_(False)
        self.sampler = self.policy
        self.tokenizer = bench_tokenizer(base_model)
        self.prompts = make_prompts(args, base_model.config.vocab_size)
        self.params = [p for m in (self.policy, self.value_model) for p in m.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(self.params)

    def modules(self):
        return [self.policy, self.ref_policy, self.value_model, self.reward_model]

    @torch.no_grad()
    def make_experience(self, responses) -> Experience:
        ids, mask, action_mask, prompt_width = pack_sequences(
            responses.prompt_ids, responses.response_ids, self.tokenizer.pad_token_id
        )
        offset = prompt_width - 1
        logprobs, _entropy = response_logprobs(self.policy, ids, mask, offset, with_entropy=True)
        ref_logprobs, _ = response_logprobs(self.ref_policy, ids, mask, offset)
        values = self.value_model.per_token(ids, mask)[:, offset:-1]
        scores = self.reward_model.sequence_score(ids, mask)
        rewards, advantages, returns = advantages_of(scores, logprobs, ref_logprobs, values, action_mask)
        return Experience(
            ids, mask, action_mask, None, logprobs, ref_logprobs, values, rewards, advantages, returns, prompt_width
        )

    def update(self, experience: Experience) -> None:
        ppo_epochs(experience, self._forward, self.params, self.optimizer, self.args.ppo_epochs, self.args.mini_batch)

    def _forward(self, batch: Experience):
        offset = batch.logprob_offset
        logprobs, _ = response_logprobs(self.policy, batch.input_ids, batch.attention_mask, offset)
        values = self.value_model.per_token(batch.input_ids, batch.attention_mask)[:, offset:-1]
        return logprobs, values


LAYOUTS = {"hydrappo": HydraLayout, "classic": ClassicLayout}


# ---------------------------------------------------------------------------- measuring
def interleaved_medians(candidates: dict, repeats: int) -> dict[str, float | dict]:
    """One warm-up call each, then `repeats` rounds, alternating the order every round.
    A candidate returns None (its wall time is used) or a dict of phase times."""
    for fn in candidates.values():
        fn()
    samples: dict[str, list] = {name: [] for name in candidates}
    names = list(candidates)
    for round_index in range(repeats):
        for name in names if round_index % 2 == 0 else reversed(names):
            start = time.perf_counter()
            result = candidates[name]()
            samples[name].append(result if isinstance(result, dict) else time.perf_counter() - start)
    medians = {}
    for name, values in samples.items():
        if isinstance(values[0], dict):
            medians[name] = {key: statistics.median(v[key] for v in values) for key in values[0]}
        else:
            medians[name] = statistics.median(values)
    return medians


def peak_memory_child(layout_name: str, arg_dict: dict) -> tuple[int, int]:
    """Runs in a fresh spawned process: (peak RSS growth, RSS after imports), in bytes."""
    args = argparse.Namespace(**arg_dict)
    configure(args)
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    MODEL_FOR_CAUSAL_LM_MAPPING[type(model_config(args))]  # import the modeling code before the baseline
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    layout = LAYOUTS[layout_name](build_base_model(args), args)
    for _ in range(args.memory_iterations):
        layout.iteration()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return (peak - baseline) * 1024, baseline * 1024  # ru_maxrss is in KiB on Linux


def measure_peak_memory(args) -> dict[str, int]:
    """Peak RSS growth of each layout, and its child's RSS after imports ("<name> baseline").

    Each layout runs in its own child, one after the other, before the parent holds any
    model: nothing of the parent's footprint can leak into a child's numbers."""
    context = multiprocessing.get_context("spawn")
    peaks = {}
    for name in LAYOUTS:
        pool = context.Pool(1)
        try:
            peaks[name], peaks[f"{name} baseline"] = pool.apply(peak_memory_child, (name, vars(args)))
        finally:
            pool.close()
            pool.join()
    return peaks


def bench_iteration(hydra: HydraLayout, classic: ClassicLayout, repeats: int) -> dict:
    return interleaved_medians({"hydrappo": hydra.iteration, "classic": classic.iteration}, repeats)


def bench_generation(hydra: HydraLayout, repeats: int) -> dict[str, float]:
    """The trainer's generate (generate_responses on the hydra) against the unwrapped model's own generate, same config."""
    config = generation_config(hydra.gen_args, hydra.tokenizer)
    ids, mask = left_pad(hydra.prompts, hydra.tokenizer.pad_token_id)
    model = hydra.hydra.model

    @torch.no_grad()
    def plain():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        assert out.shape[1] - ids.shape[1] == hydra.args.new_tokens

    def via_hydra():
        responses = hydra.rollout()
        assert all(len(r) == hydra.args.new_tokens for r in responses.response_ids)

    return interleaved_medians({"hydra generate_responses": via_hydra, "plain model.generate": plain}, repeats)


def bench_update(hydra: HydraLayout, repeats: int) -> dict[str, float]:
    """The trainer's ppo_update on one batch of experience: cached split vs the whole trunk."""
    trainer, plan = hydra.trainer, hydra.trainer.ppo_step.step_plan()
    experience, _, _ = trainer.ppo_step.make_experience(plan)

    def cached() -> None:
        trainer.ppo_step.ppo_update(experience, plan)

    def whole_trunk() -> None:
        with whole_trunk_updates(hydra.hydra):
            trainer.ppo_step.ppo_update(experience, plan)

    return interleaved_medians(
        {"forward_top on cached split": cached, "whole trunk every mini-batch": whole_trunk}, repeats
    )


# ---------------------------------------------------------------------------- report
def print_table(title: str, header: list[str], rows: list[list]) -> None:
    """First column left-aligned, the others right-aligned."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(cells):
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    print(f"\n{title}")
    for cells in [header, ["-" * w for w in widths], *rows]:
        print(line(cells))


def versus(label: str, hydra_value: float, classic_value: float, unit: str, scale: float = 1.0, digits: int = 2):
    """A table row: label, hydrappo, classic, hydrappo / classic."""
    return [
        label,
        f"{hydra_value / scale:.{digits}f} {unit}",
        f"{classic_value / scale:.{digits}f} {unit}",
        f"{hydra_value / classic_value:.3f}",
    ]


def report_iteration(args, times: dict) -> None:
    h, c = times["hydrappo"], times["classic"]
    print_table(
        f"1. one PPO iteration (median of {args.repeats}, interleaved, one process)",
        ["phase", "hydrappo", "classic", "hydra/classic"],
        [versus(phase, h[phase], c[phase], "s") for phase in h],
    )


def report_memory(args, hydra: HydraLayout, classic: ClassicLayout, peaks: dict | None) -> None:
    hb, cb = hydra.state_bytes(), classic.state_bytes()
    labels = {"params": "parameters", "trainable": "gradients (= trainable params)", "adam": "AdamW state"}
    rows = [versus(label, hb[key], cb[key], "MiB", MIB, 1) for key, label in labels.items()]
    rows.append(versus("params + grads + AdamW", sum(hb.values()), sum(cb.values()), "MiB", MIB, 1))
    if peaks:
        rows.append(versus("peak RSS growth (own child process)", peaks["hydrappo"], peaks["classic"], "MiB", MIB, 0))
    print_table("   memory", ["", "hydrappo", "classic", "hydra/classic"], rows)
    if peaks:
        print(
            f"   peak RSS: each layout built and run for {args.memory_iterations} PPO iteration(s) in its own "
            "spawned child;\n   ru_maxrss(RUSAGE_SELF) at the end minus ru_maxrss after imports "
            f"({peaks['hydrappo baseline'] / MIB:.0f} / {peaks['classic baseline'] / MIB:.0f} MiB). "
            "Timing ran in this process."
        )


def report_generation(args, times: dict) -> None:
    tokens = args.batch * args.new_tokens
    hydra_time, plain_time = times["hydra generate_responses"], times["plain model.generate"]
    print_table(
        f"2. generation, {args.batch} x {args.new_tokens} new tokens (median of {args.repeats})",
        ["", "time", "tokens/s"],
        [
            ["hydra (generate_responses)", f"{hydra_time:.2f} s", f"{tokens / hydra_time:.1f}"],
            ["plain model.generate", f"{plain_time:.2f} s", f"{tokens / plain_time:.1f}"],
        ],
    )
    ratio = plain_time / hydra_time
    print(f"   throughput ratio hydra/plain {ratio:.3f} (target >= 0.95: {'ok' if ratio >= 0.95 else 'MISSED'})")


def report_update(args, hydra: HydraLayout, times: dict) -> None:
    cached, whole = times["forward_top on cached split"], times["whole trunk every mini-batch"]
    print_table(
        f"3. update phase, N = {hydra.hydra.num_layers_unfrozen} of {hydra.hydra.arch.num_layers} layers, "
        f"{args.ppo_epochs} epochs x {-(-args.batch // args.mini_batch)} mini-batches (median of {args.repeats})",
        ["", "time"],
        [["forward_top on cached split_hidden", f"{cached:.2f} s"], ["whole trunk every mini-batch", f"{whole:.2f} s"]],
    )
    ratio = cached / whole
    print(f"   time ratio cached/whole {ratio:.3f} (target <= 0.35: {'ok' if ratio <= 0.35 else 'MISSED'})")


def bench_lora(args) -> None:
    """Issue 7's comparison: full top-N training, LoRA on the top N layers (the reference
    is the adapters switched off) and LoRA on every layer (the reference costs a second
    trunk pass), on identical copies of the base model."""
    from peft import LoraConfig

    base = build_base_model(args)
    lora = LoraConfig(r=args.lora_rank, lora_alpha=2 * args.lora_rank, target_modules="all-linear")
    layouts = {
        f"full top-{args.num_layers_unfrozen}": HydraLayout(copy.deepcopy(base), args, reward_branch=False),
        f"LoRA r={args.lora_rank}, top {args.num_layers_unfrozen} layers": HydraLayout(
            copy.deepcopy(base), args, lora=lora, lora_layers="top", reward_branch=False
        ),
        f"LoRA r={args.lora_rank}, all layers": HydraLayout(
            copy.deepcopy(base), args, lora=lora, lora_layers="all", reward_branch=False
        ),
    }
    times = interleaved_medians({name: layout.iteration for name, layout in layouts.items()}, args.repeats)
    full_name = next(iter(layouts))
    print(f"\nLoRA: one PPO iteration (median of {args.repeats}, interleaved, one process; no reward branch)")
    header = f"{'':<34s} {'params':>10s} {'trainable':>10s} {'AdamW':>9s} {'generate':>9s} {'experience':>11s} {'update':>8s} {'total':>8s} {'vs full':>8s}"
    print(header)
    for name, layout in layouts.items():
        state, t = layout.state_bytes(), times[name]
        print(
            f"{name:<34s} {state['params'] / MIB:8.1f}Mi {state['trainable'] / MIB:8.2f}Mi {state['adam'] / MIB:7.2f}Mi "
            f"{t['generate']:8.2f}s {t['experience']:10.2f}s {t['update']:7.2f}s {t['total']:7.2f}s "
            f"{t['total'] / times[full_name]['total']:8.3f}"
        )


def bench_reuse(args) -> None:
    """One PPO iteration after issue 15 (the experience pass on the split hidden states recorded
    while sampling, one prefill per distinct prompt) against before it (the whole trunk again,
    a prefill per row), on identical copies of the base model, interleaved in this process."""
    base = build_base_model(args)
    layouts = {
        "before": HydraLayout(copy.deepcopy(base), args, reuse_trunk=False, reward_branch=not args.no_reward_branch),
        "after": HydraLayout(copy.deepcopy(base), args, reuse_trunk=True, reward_branch=not args.no_reward_branch),
    }
    times = interleaved_medians({name: layout.iteration for name, layout in layouts.items()}, args.repeats)
    old, new = times["before"], times["after"]
    scoring = "a fixed score, no reward branch" if args.no_reward_branch else "reward branch"
    print(f"\nexperience pass: one PPO iteration (median of {args.repeats}, interleaved, one process; {scoring})")
    print(f"{'':<26s} {'generate':>9s} {'experience':>11s} {'update':>8s} {'total':>8s}")
    for name, t in times.items():
        print(f"{name:<26s} {t['generate']:8.2f}s {t['experience']:10.2f}s {t['update']:7.2f}s {t['total']:7.2f}s")
    print(
        f"{'ratio (after / before)':<26s} "
        + " ".join(
            f"{new[k] / old[k]:{w}.3f} " for k, w in (("generate", 8), ("experience", 10), ("update", 7), ("total", 7))
        )
    )


def main(argv=None) -> None:
    args = parse_args(argv)
    configure(args)
    print("$ " + shlex.join([sys.executable, *sys.argv]))
    config = model_config(args)
    print(
        f"model {args.model}: {config.num_hidden_layers} layers, hidden {config.hidden_size}, vocab "
        f"{config.vocab_size}; N = {args.num_layers_unfrozen}; batch {args.batch} prompts x {args.prompt_len} "
        f"tokens, {args.new_tokens} new tokens, {args.ppo_epochs} PPO epochs, mini-batch {args.mini_batch}; "
        f"float32, {torch.get_num_threads()} threads, torch {torch.__version__}, transformers "
        f"{transformers.__version__}",
        flush=True,
    )

    if args.lora_rank:
        bench_lora(args)
        return
    if args.compare_reuse:
        bench_reuse(args)
        return
    peaks = None if args.skip_memory else measure_peak_memory(args)
    base = build_base_model(args)
    hydra = HydraLayout(copy.deepcopy(base), args)
    classic = ClassicLayout(base, args)
    iteration = bench_iteration(hydra, classic, args.repeats)
    generation = bench_generation(hydra, args.repeats)
    update = bench_update(hydra, args.repeats)
    report_iteration(args, iteration)
    report_memory(args, hydra, classic, peaks)
    report_generation(args, generation)
    report_update(args, hydra, update)


if __name__ == "__main__":
    main()
