"""Time per episode token of multi-turn tool episodes, with the KV cache carried from turn to turn
and without it (each turn prefills its whole context again), side by side in one process, and a
single-turn response of the same total length for comparison.

    python tools/lab/bench_episodes.py --model tiny                    # a 4-layer random Llama
    python tools/lab/bench_episodes.py                                 # SmolLM2-135M-Instruct
    python tools/lab/bench_episodes.py --turns 4 --reply-tokens 24 --prompts 2 -G 8

The workload: --prompts random prompts x -G episodes each (the first turn's prefill shared, as in
training), each episode --turns replies of exactly --reply-tokens tokens with a tool turn after
every reply but the last (a tool whose result is --tool-words words, rendered by the chat
template), played by agent/episodes.py with the decode loop's sampler, recording the split states
as the trainer does. The single-turn call samples, for the same prompts, one response as long as
an episode (its replies and tool turns together).

Reply lengths are scripted so that every candidate does the same work: the decode loop draws every
token as usual (the draw's cost stays in), then the drawn token is replaced by a fixed word, and by
EOS at the reply's last step. What the model computes is unchanged: the same passes over the same
number of tokens. The episodes of a prompt are then identical; real ones differ after their first
reply, so the candidate that prefills every turn shares only the first turn's prefill (the cache
carrying one shares the first turn's, and extends each episode's own cache after that).

Prints, per candidate, the median seconds of a call over --repeats rounds (after a warm-up round,
the order rotating every round), seconds per episode token (policy and tool tokens after the
prompt) and per policy token (the tool turns are prefilled, not sampled: a stricter measure), and
their ratios to the single-turn response's seconds per token. On a shared machine compare the
ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

# Passive OpenMP waits: spinning threads on a busy machine measure its load (tools/lab/bench_sampling.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_sampling import load  # noqa: E402 (imports no torch)

if TYPE_CHECKING:
    from hydrappo.agent.episodes import Agent
    from hydrappo.config import GenerationArgs

# torch and hydrappo are imported where they are used, so that --help answers at once.

TEMPLATE = (  # for the tiny model's word-level tokenizer, which has none
    "{% for m in messages %}t4 {{ m['role'] }} {{ m['content'] }} t2 {% endfor %}"
    "{% if add_generation_prompt %}t4 assistant{% endif %}"
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="tiny | a model name hydrappo loads")
    parser.add_argument("-N", "--num-layers-unfrozen", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("-G", "--episodes-per-prompt", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=32, help="prompt tokens (random ids)")
    parser.add_argument("--turns", type=int, default=3, help="policy replies per episode")
    parser.add_argument("--reply-tokens", type=int, default=16, help="tokens of every reply (its EOS included)")
    parser.add_argument("--tool-words", type=int, default=4, help="words of the tool's result")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--no-warmup", action="store_true", help="no warm-up round (the probe that checks the script warms the loop)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: leave as is)")
    return parser.parse_args(argv)


class Script:
    """Replies of exactly `length` tokens: decode's drawn token replaced by `word`, and by EOS at
    the reply's last step (the step count restarts with every decode call)."""

    def __init__(self, word: int, eos: int):
        from hydrappo.generation import decode as decode_module
        from hydrappo.generation import responses as responses_module

        self.word, self.eos, self.length, self.step = word, eos, 1, 0
        self.modules = decode_module, responses_module
        self.draw, self.decode = decode_module.next_tokens, responses_module.decode

    def __enter__(self):
        import torch

        decode_module, responses_module = self.modules

        def next_tokens(logits, rule):
            drawn = self.draw(logits, rule)  # the draw's cost stays in
            self.step += 1
            return torch.full_like(drawn, self.eos if self.step == self.length else self.word)

        def decode(*args, **kwargs):
            self.step = 0
            return self.decode(*args, **kwargs)

        decode_module.next_tokens, responses_module.decode = next_tokens, decode
        return self

    def __exit__(self, *exc):
        decode_module, responses_module = self.modules
        decode_module.next_tokens, responses_module.decode = self.draw, self.decode


def make_agent(tokenizer, args, generation: GenerationArgs) -> Agent:
    from hydrappo.agent.calls import Call
    from hydrappo.agent.episodes import Agent
    from hydrappo.agent.toolbox import tool_of

    result = " ".join(["done"] * args.tool_words)

    def lookup(word: str) -> str:
        """Look a word up.

        Args:
            word: The word.
        """
        return result

    return Agent(
        tools=[tool_of(lookup)],
        environments=None,
        parse=lambda text: [Call({"name": "lookup", "arguments": {"word": "x"}})],  # every reply calls
        max_iterations=args.turns - 1,  # the last reply's call is judged, not executed: `turns` replies
        max_episode_tokens=10**6,
        timeout_s=None,
        on_error="stop",
        renders_tools=False,
        tokenizer=tokenizer,
        generation=generation,
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from hydrappo.agent.episodes import Episode, run_episodes
    from hydrappo.agent.toolbox import toolset
    from hydrappo.config import GenerationArgs
    from hydrappo.generation.samplers import DecodeSampler

    if args.threads:
        torch.set_num_threads(args.threads)
    hydra, tokenizer = load(args)
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = TEMPLATE
    generator = torch.Generator().manual_seed(1)
    prompts = [
        torch.randint(10, len(tokenizer), (args.prompt_len,), generator=generator).tolist() for _ in range(args.prompts)
    ]
    rows = [p for p in prompts for _ in range(args.episodes_per_prompt)]
    word = tokenizer("a", add_special_tokens=False)["input_ids"][-1] if args.model != "tiny" else 5
    script = Script(word, tokenizer.eos_token_id)
    turn_args = GenerationArgs(max_new_tokens=args.reply_tokens, generation_batch_size=len(rows), temperature=1.0)
    agent = make_agent(tokenizer, args, turn_args)
    sampler = DecodeSampler(hydra, tokenizer)

    turns_played = [0]

    def prefilling(prompt_ids, generation, greedy=False, record_split=False):  # a plain function: no cache carried
        # The scripted episodes of a prompt are identical, which real ones are not after their
        # first reply: only the first turn shares its prefill, as with real episodes.
        turns_played[0] += 1
        generation = dataclasses.replace(generation, share_prompt_prefill=turns_played[0] == 1)
        return sampler.sample(prompt_ids, generation, greedy=greedy, record_split=record_split)

    def episodes(sample):
        script.length, turns_played[0] = args.reply_tokens, 0
        played = [Episode(prompt_ids=list(p), tools=toolset(agent.tools), environment=None) for p in rows]
        return run_episodes(agent, played, sample, tokenizer, turn_args, step=0, record_split=True)

    with script:
        probe = episodes(sampler.sample)
    lengths = {len(r) for r in probe.response_ids}
    policy_tokens = sum(sum(m) for m in probe.policy_mask) / len(rows)
    episode_tokens = sum(len(r) for r in probe.response_ids) / len(rows)
    single_args = GenerationArgs(max_new_tokens=int(episode_tokens), generation_batch_size=len(rows), temperature=1.0)

    def single():
        script.length = int(episode_tokens)  # one reply as long as an episode, its last token EOS
        return sampler.sample(rows, single_args, record_split=True)

    candidates = {
        "episodes, cache carried": lambda: episodes(sampler.sample),
        "episodes, prefilled per turn": lambda: episodes(prefilling),
        "single turn, same length": single,
    }
    seconds = {name: [] for name in candidates}
    with script, torch.no_grad():
        for run in [] if args.no_warmup else candidates.values():
            run()
        for round_ in range(args.repeats):
            names = list(candidates)
            names = names[round_ % len(names) :] + names[: round_ % len(names)]
            for name in names:
                start = time.perf_counter()
                out = candidates[name]()
                seconds[name].append(time.perf_counter() - start)
                if name != "single turn, same length":
                    assert out.response_ids == probe.response_ids, "the scripted episodes differ between candidates"

    print(
        f"{args.model}: {args.prompts} prompts x {args.episodes_per_prompt} episodes, prompt {args.prompt_len} tokens, "
        f"{args.turns} turns of {args.reply_tokens} tokens; episode {episode_tokens:.0f} tokens after the prompt "
        f"({policy_tokens:.0f} the policy's; lengths {sorted(lengths)}); threads {torch.get_num_threads()}; "
        f"median of {args.repeats}"
    )
    single_per_token = statistics.median(seconds["single turn, same length"]) / (len(rows) * int(episode_tokens))
    print(
        f"{'candidate':30s} {'s/call':>7s} {'ms/episode tok':>15s} {'ms/policy tok':>14s} "
        f"{'x single (episode tok)':>23s} {'x single (policy tok)':>22s}"
    )
    for name, times in seconds.items():
        median = statistics.median(times)
        if name.startswith("single"):
            per_token = median / (len(rows) * int(episode_tokens))
            print(f"{name:30s} {median:7.3f} {1000 * per_token:15.3f} {1000 * per_token:14.3f} {1:23.2f} {1:22.2f}")
            continue
        per_episode, per_policy = median / (len(rows) * episode_tokens), median / (len(rows) * policy_tokens)
        print(
            f"{name:30s} {median:7.3f} {1000 * per_episode:15.3f} {1000 * per_policy:14.3f} "
            f"{per_episode / single_per_token:23.2f} {per_policy / single_per_token:22.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
