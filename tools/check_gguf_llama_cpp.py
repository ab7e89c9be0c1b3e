"""Does llama.cpp run an exported .gguf file as transformers runs the model? Greedy tokens side by side.

    python tools/check_gguf_llama_cpp.py --gguf policy.gguf --model models/policy
    python tools/check_gguf_llama_cpp.py --gguf policy.gguf --model models/policy --new-tokens 64 --threads 2

`--model` is the transformers folder the file was written from (`hydrappo export CHECKPOINT --out DIR`;
`hydrappo export DIR --out policy.gguf` writes the file from it). On 4 fixed prompts, each tokenized by the
folder's tokenizer, transformers (float32) and llama.cpp (through its Python bindings, llama-cpp-python) each
take the most likely token 32 times (--new-tokens), from the same prompt ids and without stopping at EOS.
Per prompt it prints how many of the new tokens agree before the first mismatch, and that mismatch with
transformers' logit gap between the two tokens (an f16 or q8_0 file may flip a near tie: a gap of a few
hundredths is rounding, a wrong layout disagrees from the first token). It also says whether llama.cpp's own
tokenizer reads the prompt into the same ids. Exit status 1 when a prompt agrees on fewer than --min-agree
tokens (default 0: report only), 2 when llama-cpp-python is not installed.
"""

from __future__ import annotations

import argparse
import os
import sys

# llama_cpp, torch and transformers are imported in main(), after the arguments, so --help answers at once.

PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
)
INSTALL = (
    "tools/check_gguf_llama_cpp.py needs llama.cpp's Python bindings: `pip install llama-cpp-python`. PyPI ships "
    "them as source, so pip builds llama.cpp with a C++ compiler and cmake (apt-get install build-essential cmake); "
    "that build takes many minutes on a small machine."
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Greedy tokens of a .gguf in llama.cpp against transformers.")
    parser.add_argument("--gguf", required=True, help="the .gguf file (written by hydrappo export ... --out x.gguf)")
    parser.add_argument("--model", required=True, help="the transformers model folder the file was written from")
    parser.add_argument("--new-tokens", type=int, default=32, help="greedy tokens per prompt (default 32)")
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp's threads (default: its own choice)")
    parser.add_argument("--min-agree", type=int, default=0, help="exit 1 when a prompt agrees on fewer tokens")
    return parser.parse_args(argv)


def transformers_greedy(model, ids: list[int], new_tokens: int) -> tuple[list[int], list]:
    """The most likely next token `new_tokens` times (no EOS stop) and each step's float32 logits; the whole
    sequence each step, without a cache (a few dozen tokens: the plainest forward there is)."""
    import torch

    tokens, logits = [], []
    with torch.no_grad():
        for _ in range(new_tokens):
            last = model(input_ids=torch.tensor([ids + tokens])).logits[0, -1].float()
            logits.append(last)
            tokens.append(int(last.argmax()))
    return tokens, logits


def llama_cpp_greedy(llm, ids: list[int], new_tokens: int) -> list[int]:
    import numpy as np

    llm.reset()
    llm.eval(ids)
    tokens = []
    for _ in range(new_tokens):
        tokens.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval([tokens[-1]])
    return tokens


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import llama_cpp
    except ImportError:
        print(INSTALL, file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    prompts = [tokenizer(text).input_ids for text in PROMPTS]
    llm = llama_cpp.Llama(
        model_path=args.gguf,
        n_ctx=max(map(len, prompts)) + args.new_tokens + 8,
        logits_all=True,  # the scores of every evaluated position, read for the argmax
        n_threads=args.threads,
        verbose=False,
    )
    print(f"{args.gguf} in llama.cpp (llama-cpp-python {llama_cpp.__version__}) against {args.model} in transformers")
    worst = args.new_tokens
    for text, ids in zip(PROMPTS, prompts):
        same_ids = llm.tokenize(text.encode(), add_bos=False, special=True) == [
            i for i in ids if i != tokenizer.bos_token_id
        ]
        expected, logits = transformers_greedy(model, ids, args.new_tokens)
        got = llama_cpp_greedy(llm, ids, args.new_tokens)
        agree = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), args.new_tokens)
        worst = min(worst, agree)
        line = f"{text!r}: {agree}/{args.new_tokens} tokens agree; llama.cpp tokenizes the prompt alike: {same_ids}"
        if agree < args.new_tokens:
            a, b = expected[agree], got[agree]
            gap = float(logits[agree][a] - logits[agree][b])
            line += (
                f"\n  first mismatch at new token {agree}: transformers {tokenizer.decode([a])!r} ({a}), llama.cpp "
                f"{tokenizer.decode([b])!r} ({b}); transformers' logit gap between them {gap:.3f}"
            )
        print(line + f"\n  transformers: {tokenizer.decode(expected)!r}")
    print(f"fewest tokens agreeing before a mismatch: {worst}/{args.new_tokens} on {len(PROMPTS)} prompts")
    return 1 if worst < args.min_agree else 0


if __name__ == "__main__":
    sys.exit(main())
