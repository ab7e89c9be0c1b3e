"""Build the preference data set of the pipeline example (Gao et al. 2022 style).

The policy (SmolLM2-135M-Instruct) answers each prompt twice; the GOLD reward (VADER's
compound sentiment of the response, examples/sentiment/reward.py) picks the chosen one.
The learned reward branch sees only these preferences, never the gold scores.

    python examples/preference/make_pairs.py            # 1,000 pairs -> outputs/preference/pairs.jsonl

Responses are sampled exactly as PPO's rollouts are (chat template, max_new_tokens,
temperature of examples/preference/ppo.yaml), so the reward model learns on the
distribution PPO starts from. They are stored with their special tokens: a response
that ended holds its EOS (<|im_end|>) and one cut at max_new_tokens does not, so the
reward config uses append_eos: false and scores the very tokens PPO will score.
Pairs whose gold scores tie (e.g. two neutral answers, both 0.0) say nothing and are
skipped; prompts are reused in shuffled rounds until there are enough pairs.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "sentiment"))

from reward import reward_fn as gold_reward  # noqa: E402  (examples/sentiment/reward.py)

from hydrappo import HydraModel  # noqa: E402
from hydrappo.config import GenerationArgs, ModelConfig  # noqa: E402
from hydrappo.data import load_prompt_texts, tokenize_prompts  # noqa: E402
from hydrappo.generation.responses import generate_responses  # noqa: E402
from hydrappo.storage.models import load_model_and_tokenizer  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", default=str(HERE.parent / "sentiment" / "prompts.jsonl"))
    parser.add_argument("--output", default="outputs/preference/pairs.jsonl")
    parser.add_argument("--num_pairs", type=int, default=1000)
    parser.add_argument("--max_new_tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--max_prompt_length", type=int, default=64)
    parser.add_argument("--batch_size", type=int, default=64, help="responses per generate() call")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    torch.manual_seed(args.seed)
    model, tokenizer = load_model_and_tokenizer(ModelConfig(name_or_path=args.model))
    hydra = HydraModel(model, 0)  # only for sampling: nothing is copied or trained
    texts = load_prompt_texts(args.prompts)
    prompts = tokenize_prompts(texts, tokenizer, args.max_prompt_length, apply_chat_template=True)
    generation = GenerationArgs(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, generation_batch_size=args.batch_size
    )
    rng = random.Random(args.seed)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    pairs = ties = 0
    start = time.perf_counter()
    with tmp.open("w") as handle:
        while pairs < args.num_pairs:
            order = list(range(len(texts)))
            rng.shuffle(order)
            for first in range(0, len(order), args.batch_size // 2):
                chunk = order[first : first + args.batch_size // 2]
                # Each prompt twice, side by side, in one generate() call.
                twice = [prompts.input_ids[i] for i in chunk for _ in (0, 1)]
                responses = generate_responses(hydra, tokenizer, twice, generation).response_ids
                raw = tokenizer.batch_decode(responses, skip_special_tokens=False)
                clean = tokenizer.batch_decode(responses, skip_special_tokens=True)
                scores = gold_reward(samples=clean, prompts=[texts[i] for i in chunk for _ in (0, 1)], outputs=clean)
                for k, index in enumerate(chunk):
                    a, b = 2 * k, 2 * k + 1
                    if scores[a] == scores[b]:
                        ties += 1
                        continue
                    win, lose = (a, b) if scores[a] > scores[b] else (b, a)
                    row = {
                        "prompt": texts[index],
                        "chosen": raw[win],
                        "rejected": raw[lose],
                        "gold_chosen": scores[win],
                        "gold_rejected": scores[lose],
                    }
                    handle.write(json.dumps(row) + "\n")
                    pairs += 1
                    if pairs == args.num_pairs:
                        break
                logging.info(
                    "%d/%d pairs (%d ties skipped), %.0f s", pairs, args.num_pairs, ties, time.perf_counter() - start
                )
                if pairs == args.num_pairs:
                    break
    tmp.replace(out)
    print(f"wrote {pairs} pairs to {out} ({ties} tied pairs skipped) in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
