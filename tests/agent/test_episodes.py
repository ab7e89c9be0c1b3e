"""Multi-turn episodes (agent/episodes.py): an episode is one sequence, the policy's replies
in the action mask, the tool turns out of it but in the attention mask; the loss has no gradient
with respect to the tool tokens' log-probs and equals the hand-computed loss over the policy's
tokens (float64); the split states recorded while playing the episode (tool turns prefilled
through the trunk) give the experience pass of a whole-sequence pass; and the episode ends for
each of its reasons."""

import time

import pytest
import torch

from hydrappo.agent.calls import Call
from hydrappo.agent.toolbox import Environments, load_object, tool_of
from hydrappo.algo.losses import PolicyTokens, PPOLossSettings, SampledTokens, ppo_loss
from hydrappo.config import GenerationArgs
from hydrappo.agent.episodes import Agent, run_episodes, start_episodes, summarize
from hydrappo.generation.responses import Responses, generate_responses
from hydrappo.generation.samplers import DecodeSampler
from hydrappo.data import pack_sequences
from hydrappo.train.sequences import experience_pass, pack_split_hidden

from recorded import float64_hydra
from runs import ROOT
from tiny import tiny_tokenizer

STOPS = list(range(4, 30))  # words w0..w25 end a turn: greedy turns of a random model rarely reach <eos>
FIXTURE = ROOT / "tests" / "fixtures" / "agent_tools.py"
Shelf, lookup = (load_object(f"{FIXTURE}:{name}", None, "fixture") for name in ("Shelf", "lookup"))

# A chat template over the tiny vocabulary: a turn is its role's word, its content and <eos>.
TEMPLATE = (
    "{% for m in messages %}{{ {'system': 'w0', 'user': 'w1', 'assistant': 'w2', 'tool': 'w3'}[m['role']] }} "
    "{{ m['content'] }} <eos> {% endfor %}{% if add_generation_prompt %}w2{% endif %}"
)


def tokenizer():
    tok = tiny_tokenizer()
    tok.chat_template = TEMPLATE
    return tok


def calls_when(word):
    """A parser: a turn holding `word` calls lookup."""
    return lambda text: [Call({"name": "lookup", "arguments": {"word": word}})] if word in text.split() else []


def agent(tools=(lookup,), environments=None, parse=None, max_iterations=None, max_tokens=64, on_error="stop"):
    return Agent(
        tools=[tool_of(t) for t in tools],
        environments=environments,
        parse=parse or calls_when("w5"),
        max_iterations=max_iterations,
        max_episode_tokens=max_tokens,
        timeout_s=None,
        on_error=on_error,
        renders_tools=False,
    )


def scripted(tok, replies):
    """A sampler that answers the k-th turn of every episode with replies[k] (words; each ends with <eos>)."""
    turns = []

    def sample(prompt_ids, args, greedy=False, record_split=False):
        turns.append(len(prompt_ids))
        words = replies[min(len(turns) - 1, len(replies) - 1)]
        reply = tok(words + " <eos>", add_special_tokens=False)["input_ids"]
        return Responses(
            prompt_ids=prompt_ids, response_ids=[list(reply) for _ in prompt_ids], ended=[True] * len(prompt_ids)
        )

    return sample, turns


def episodes_of(tok, a, rows=1):
    return start_episodes(a, tok, [{"prompt": "w9"}] * rows, [[{"role": "user", "content": "w9"}]] * rows, None, step=1)


def test_an_episode_is_one_sequence_with_the_tool_turns_out_of_the_action_mask():
    tok = tokenizer()
    sample, turns = scripted(tok, ["w5 w6", "w7"])
    a = agent()
    out = run_episodes(a, episodes_of(tok, a, rows=2), sample, tok, GenerationArgs(max_new_tokens=4), step=1)
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    # the call, the tool turn (the result "g1 g2 g3" is not in the tiny vocabulary: <unk>s), the answer
    tool_turn = ids("w3 g1 g2 g3 <eos> w2")
    assert out.response_ids[0] == ids("w5 w6 <eos>") + tool_turn + ids("w7 <eos>")
    assert out.policy_mask[0] == [1, 1, 1] + [0] * len(tool_turn) + [1, 1]
    assert out.final_texts == ["w7", "w7"] and out.ended == [True, True] and turns == [2, 2]
    assert out.episode_stats[0] == {
        "tool_calls": 1.0,
        "valid_calls": 1.0,
        "called_validly": 1.0,
        "tool_rounds": 1.0,
        "failed_calls": 0.0,
        "tokens": float(len(out.response_ids[0])),
    }
    assert summarize(out.episode_stats, "agent/")["agent/valid_call_rate"] == 1.0
    # The packed episode: the tool turn is attended to (context) but is no action.
    input_ids, attention, action, width = pack_sequences(
        out.prompt_ids, out.response_ids, tok.pad_token_id, out.policy_mask
    )
    assert action[0].tolist() == [float(m) for m in out.policy_mask[0]] and attention[0, width:].sum() == len(
        out.response_ids[0]
    )


@pytest.mark.parametrize(
    "how, expected_turns, rounds",
    [
        ("answer", 1, 0),  # no call: the reply is the answer
        ("round_limit", 2, 1),  # max_tool_calling_iterations=1: the second call is not executed
        ("environment_done", 2, 2),  # Shelf is done after two lookups: no tool turn after the second
        ("token_budget", 1, 1),  # the next turn would not fit in max_episode_tokens
    ],
)
def test_episodes_end_for_each_reason(how, expected_turns, rounds):
    tok = tokenizer()
    sample, turns = scripted(tok, ["w7"] if how == "answer" else ["w5"])
    options = {
        "round_limit": {"max_iterations": 1},
        "token_budget": {"max_tokens": 8},
        "environment_done": {"tools": (), "environments": Environments(Shelf, [])},
    }.get(how, {})
    a = agent(**options)
    out = run_episodes(a, episodes_of(tok, a), sample, tok, GenerationArgs(max_new_tokens=4), step=1)
    assert len(turns) == expected_turns and out.episode_stats[0]["tool_rounds"] == rounds
    assert out.policy_mask[0][-1] == 1  # an episode always ends with the policy's token


def lookup_words():
    """A tool whose result is words of the tiny vocabulary."""

    def lookup(word: str) -> str:
        """Look a word up.

        Args:
            word: The word.
        """
        return "w40 w41 w42"

    return lookup


def played_on_the_hydra(record_split):
    """Episodes sampled greedily from a float64 tiny hydra: every turn that ends calls the tool
    once (one round at most), so ended first turns get a tool turn and a second reply."""
    tok = tokenizer()
    hydra = float64_hydra(eos_boost=3.0)
    a = agent(
        tools=(lookup_words(),),
        parse=lambda text: [Call({"name": "lookup", "arguments": {"word": "w1"}})],
        max_iterations=1,
    )

    def sample(prompt_ids, args, greedy=False, record_split=False):
        return generate_responses(hydra, tok, prompt_ids, args, record_split=record_split, greedy=greedy, loop="decode")

    rows = [{"prompt": f"w{10 + i} w{20 + i}"} for i in range(6)]
    episodes = start_episodes(a, tok, rows, [[{"role": "user", "content": r["prompt"]}] for r in rows], None, step=1)
    out = run_episodes(
        a,
        episodes,
        sample,
        tok,
        GenerationArgs(max_new_tokens=6, generation_batch_size=4, stop_token_ids=STOPS),
        greedy=True,
        record_split=record_split,
    )
    return hydra, tok, out


def test_recorded_states_of_an_episode_give_the_whole_pass():
    """The tool turns are prefilled through the trunk while playing; the states recorded by each
    episode's last turn cover it whole, so the experience pass needs no second pass of the bottom."""
    hydra, tok, out = played_on_the_hydra(record_split=True)
    assert any(0 in mask for mask in out.policy_mask) and any(0 not in mask for mask in out.policy_mask)
    ids, mask, action, width = pack_sequences(out.prompt_ids, out.response_ids, tok.pad_token_id, out.policy_mask)
    split = pack_split_hidden(out, width, ids.shape[1])
    whole = experience_pass(hydra, ids, mask, width, chunk_size=4)
    reused = experience_pass(hydra, ids, mask, width, chunk_size=4, split_hidden=split)
    for name in ("logprobs", "ref_logprobs", "values"):
        a, b = getattr(whole, name), getattr(reused, name)
        if a is not None:
            # float64 sums over a few dozen terms of size ~1: 1e-10 is far above their rounding, far below any real difference
            assert torch.allclose(a * action, b * action, rtol=0, atol=1e-10), name


def test_tool_tokens_have_no_gradient_and_the_loss_is_the_hand_computed_one():
    hydra, tok, out = played_on_the_hydra(record_split=False)
    ids, mask, action, width = pack_sequences(out.prompt_ids, out.response_ids, tok.pad_token_id, out.policy_mask)
    tool = (mask[:, width:] == 1) & (action == 0)
    assert tool.any()
    logprobs = experience_pass(hydra, ids, mask, width).logprobs.detach().requires_grad_(True)
    generator = torch.Generator().manual_seed(0)
    old = logprobs.detach() + 0.3 * torch.randn(logprobs.shape, generator=generator, dtype=torch.float64)
    advantages = torch.randn(logprobs.shape, generator=generator, dtype=torch.float64)
    loss, _ = ppo_loss(
        PolicyTokens(logprobs), SampledTokens(old, advantages, action), PPOLossSettings(cliprange=0.2, vf_coef=0.0)
    )
    loss.backward()
    assert (logprobs.grad[tool] == 0).all() and (logprobs.grad[action.bool()] != 0).any()

    # By hand, from the model's own logits over the whole sequence (no hydra, no masks of ours):
    # token-mean over the policy's tokens of max(-A r, -A clip(r, 0.8, 1.2)), r = exp(logp - old).
    with torch.no_grad():
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = hydra.model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        token_logprobs = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)[:, width - 1 :]
    terms, count = 0.0, 0
    for row in range(ids.shape[0]):
        for t in range(action.shape[1]):
            if out.policy_mask[row][t : t + 1] == [1]:
                ratio = torch.exp(token_logprobs[row, t] - old[row, t])
                a = advantages[row, t]
                terms += max(float(-a * ratio), float(-a * ratio.clamp(0.8, 1.2)))
                count += 1
    # float64: the hydra's log-probs equal the model's within ~1e-13; the loss sums ~50 such terms
    assert abs(loss.item() - terms / count) < 1e-10


def test_the_calls_of_a_turn_run_together_across_its_episodes():
    """Two episodes each write two calls of a 0.3 s tool in one turn: the four run together."""

    def nap(word: str) -> str:
        """Pause, then answer.

        Args:
            word: The word.
        """
        time.sleep(0.3)
        return f"w4{word[-1]}"

    tok = tokenizer()
    sample, _ = scripted(tok, ["w5", "w7"])

    def two_calls(text):
        return [Call({"name": "nap", "arguments": {"word": w}}) for w in ("w1", "w2")] if "w5" in text else []

    a = agent(tools=(nap,), parse=two_calls)
    start = time.perf_counter()
    out = run_episodes(a, episodes_of(tok, a, rows=2), sample, tok, GenerationArgs(max_new_tokens=4), step=1)
    seconds = time.perf_counter() - start
    # Both results in the order written, in each episode's tool turn.
    assert tok.decode(out.response_ids[0]).split().count("w41") == 1 and out.episode_stats[1]["valid_calls"] == 2.0
    assert seconds < 0.3 + 0.5, seconds  # one after another: 1.2 s


def calls_unless_a_multiple_of_three(text):
    """A parser: a reply whose word count is not a multiple of 3 calls the tool (episodes of a
    random model then end at different turns)."""
    return [Call({"name": "lookup", "arguments": {"word": "w1"}})] if len(text.split()) % 3 else []


def played_with_the_decode_loop(carry: bool):
    """Sampled episodes of up to 4 turns (3 rounds of calls) from a float64 tiny hydra with the
    decode loop's sampler, 4 prompts x 2 episodes (the first turn's prefill shared), chunks of 5;
    `carry`: the sampler's own method (it carries the KV cache), else a plain function (each turn
    prefills its context again). Returns the hydra, the episodes and the tokens fed to the model."""
    tok = tokenizer()
    hydra = float64_hydra(eos_boost=3.0)
    a = agent(tools=(lookup_words(),), parse=calls_unless_a_multiple_of_three, max_iterations=3, max_tokens=200)
    sampler = DecodeSampler(hydra, tok)

    def prefilling(prompt_ids, args, greedy=False, record_split=False):
        return sampler.sample(prompt_ids, args, greedy=greedy, record_split=record_split)

    rows = [{"prompt": f"w{10 + i} w{20 + i}"} for i in range(4) for _ in range(2)]
    episodes = start_episodes(a, tok, rows, [[{"role": "user", "content": r["prompt"]}] for r in rows], None, step=1)
    args = GenerationArgs(max_new_tokens=8, generation_batch_size=5, stop_token_ids=STOPS)
    fed: list[int] = []
    hook = hydra.model.register_forward_pre_hook(lambda m, a, kw: fed.append(kw["input_ids"].numel()), with_kwargs=True)
    torch.manual_seed(0)
    try:
        out = run_episodes(a, episodes, sampler.sample if carry else prefilling, tok, args, record_split=True)
    finally:
        hook.remove()
    return hydra, tok, out, sum(fed)


def test_a_carried_kv_cache_plays_the_same_episodes_and_records_the_whole_pass():
    """Carrying each episode's KV cache from turn to turn (the decode loop's sampler) samples the
    episodes a prefill of every turn samples (the same random draws, float64: the same tokens),
    feeds fewer tokens, and the states recorded give the whole-episode pass's log-probs, reference
    log-probs and values (float64)."""
    hydra, tok, carried, fed_carrying = played_with_the_decode_loop(carry=True)
    _, _, prefilled, fed_prefilling = played_with_the_decode_loop(carry=False)
    assert sorted({s["tool_rounds"] for s in carried.episode_stats}) == [0.0, 1.0, 2.0, 3.0]  # ended at every turn
    assert carried.response_ids == prefilled.response_ids and carried.policy_mask == prefilled.policy_mask
    for mine, theirs in zip(carried.split_hidden, prefilled.split_hidden):
        assert torch.allclose(mine, theirs, rtol=0, atol=1e-10)
    assert fed_carrying < fed_prefilling
    ids, mask, action, width = pack_sequences(
        carried.prompt_ids, carried.response_ids, tok.pad_token_id, carried.policy_mask
    )
    whole = experience_pass(hydra, ids, mask, width, chunk_size=4)
    reused = experience_pass(
        hydra, ids, mask, width, chunk_size=4, split_hidden=pack_split_hidden(carried, width, ids.shape[1])
    )
    for name in ("logprobs", "ref_logprobs", "values"):
        a, b = getattr(whole, name), getattr(reused, name)
        if a is not None:
            # float64 sums over a few dozen terms of size ~1: 1e-10 is far above their rounding, far below any real difference
            assert torch.allclose(a * action, b * action, rtol=0, atol=1e-10), name
