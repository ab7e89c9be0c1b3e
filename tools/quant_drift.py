"""How far a quantized trunk moves the policy from the unquantized model: mean |delta log-prob|
of the response tokens of a probe batch (prompts of examples/sentiment, or examples/tiny for
the tiny model, responses sampled from the unquantized model), for model.trunk_quantization int8 and 4bit.

    python tools/quant_drift.py                                   # the tiny example and SmolLM2-135M-Instruct
    python tools/quant_drift.py --model smollm2-135m-instruct -N 4 --prompts 32
    python tools/quant_drift.py --device cuda --dtype bfloat16

Each hydra is built the way training builds it (storage/models.py build_hydra); the log-probs
are the hydra's (forward_hydra), with temperature 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

# torch and hydrappo are imported in drift(), so that --help answers at once.

ROOT = Path(__file__).resolve().parents[1]
MODELS = {
    # name: (model config as the examples train it, apply the chat template)
    "tiny": (
        dict(
            name_or_path=str(ROOT / "examples" / "tiny" / "model"),
            random_init=True,
            train_lm_head=True,
            num_layers_unfrozen=2,
        ),
        False,
    ),
    "smollm2-135m-instruct": (dict(name_or_path="smollm2-135m-instruct", num_layers_unfrozen=4), True),
}


def drift(
    model: str, num_layers_unfrozen: int | None, prompts: int, new_tokens: int, device: str, dtype: str
) -> list[dict]:
    import torch

    from hydrappo.config import GenerationArgs, ModelConfig
    from hydrappo.data import tokenize_prompts
    from hydrappo.generation.responses import generate_responses
    from hydrappo.storage.checkpoint import seed_everything
    from hydrappo.storage.models import build_hydra
    from hydrappo.data import pack_sequences

    values, chat = MODELS[model] if model in MODELS else (dict(name_or_path=model, num_layers_unfrozen=4), True)
    if num_layers_unfrozen is not None:
        values = {**values, "num_layers_unfrozen": num_layers_unfrozen}
    base_config = ModelConfig(**values, dtype=dtype)

    def build(quantization: str):
        seed_everything(0)  # random-init models: the same weights every time
        config = ModelConfig(**{**base_config.__dict__, "trunk_quantization": quantization})
        return build_hydra(config, device=device, value_head=False)

    base, tokenizer = build("none")
    example = "sentiment" if chat else "tiny"
    texts = [json.loads(line)["prompt"] for line in (ROOT / "examples" / example / "prompts.jsonl").open()][:prompts]
    chat = chat and bool(getattr(tokenizer, "chat_template", None))
    prompt_ids = tokenize_prompts(texts, tokenizer, 64, apply_chat_template=chat).input_ids
    seed_everything(0)
    responses = generate_responses(
        base,
        tokenizer,
        prompt_ids,
        GenerationArgs(max_new_tokens=new_tokens, min_new_tokens=new_tokens // 2, generation_batch_size=prompts),
    ).response_ids
    input_ids, attention_mask, action_mask, width = pack_sequences(prompt_ids, responses, tokenizer.pad_token_id)
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    mask = action_mask.to(device).bool()

    def response_logprobs(hydra):
        with torch.no_grad():
            out = hydra.forward_hydra(input_ids, attention_mask, return_reference=False, logprobs_from=width - 1)
        return out.logprobs[:, width - 1 :].float()

    reference = response_logprobs(base)
    del base
    rows = []
    for quantization in ("int8", "4bit"):
        hydra, _ = build(quantization)
        delta = (response_logprobs(hydra) - reference)[mask]
        rows.append(
            {
                "model": model,
                "trunk": quantization,
                "tokens": int(mask.sum()),
                "mean_abs": delta.abs().mean().item(),
                "max_abs": delta.abs().max().item(),
                "mean": delta.mean().item(),
                "mean_logprob": reference[mask].mean().item(),
                "bottom_layers": hydra.split_index,
            }
        )
        del hydra
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", nargs="+", default=list(MODELS), help="tiny, smollm2-135m-instruct or a model directory"
    )
    parser.add_argument(
        "-N", "--num-layers-unfrozen", type=int, default=None, help="default: the example's (tiny 2, SmolLM2 4)"
    )
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args(argv)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    print(
        f"{'model':<24} {'trunk':<5} {'bottom':>6} {'tokens':>6} {'mean|dlogp|':>11} {'max|dlogp|':>10} "
        f"{'mean dlogp':>10} {'mean logp':>9}"
    )
    for model in args.model:
        for row in drift(model, args.num_layers_unfrozen, args.prompts, args.new_tokens, args.device, args.dtype):
            print(
                f"{row['model']:<24} {row['trunk']:<5} {row['bottom_layers']:>6} {row['tokens']:>6} "
                f"{row['mean_abs']:>11.4f} {row['max_abs']:>10.4f} {row['mean']:>+10.4f} {row['mean_logprob']:>9.3f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
