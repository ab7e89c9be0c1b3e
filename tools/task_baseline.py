"""A model's held-out accuracy on reasoning-gym tasks before any training: which task can an RL
run on it learn? (A base accuracy of 0 gives GRPO no signal; near 1 leaves nothing to learn.)

    python tools/task_baseline.py chain_sum basic_arithmetic --n 50

For each task, one at a time: the task's first N held-out items (tasks/reasoning_gym.py, the items
a run with `task_eval_size: N` and the same seed and options evaluates on), each through the
model's chat template, answered greedily (train.eval_greedy's answers) with up to --max-new-tokens
tokens (after --answer-start, task.task_answer_start, if given), and scored by the task's verifier (the answer between <answer> tags, the task's own
score_answer). Prints per task: the mean score, the share of answers that score 1, the share that
carry <answer> tags at all, and the seconds taken.
"""

from __future__ import annotations

import argparse
import json
import time

import yaml

# torch and hydrappo are imported where they are used, so that --help answers at once.


def answers(model, tokenizer, prompts: list[str], max_new_tokens: int, batch_size: int) -> list[str]:
    """Greedy answers, in batches of left-padded prompts."""
    import torch

    texts = []
    for start in range(0, len(prompts), batch_size):
        batch = tokenizer(
            prompts[start : start + batch_size], return_tensors="pt", padding=True, add_special_tokens=False
        )
        with torch.no_grad():
            out = model.generate(
                **batch, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )
        texts += tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    return texts


def measure(model, tokenizer, name: str, options: dict, args) -> dict:
    from hydrappo.prompts import format_prompt, trl_arguments
    from hydrappo.tasks import ReasoningGymTask

    task = ReasoningGymTask(name, size=1, seed=args.seed, eval_size=args.n, answer_start=args.answer_start, **options)
    rows, (verify,) = task.eval_dataset, task.reward_funcs
    started = time.perf_counter()
    prompts = [format_prompt(row["prompt"], tokenizer, True) for row in rows]
    completions = answers(model, tokenizer, prompts, args.max_new_tokens, args.batch_size)
    if args.answer_start:  # as a run scores them: the continued assistant turn, its start included
        completions = [turns[0]["content"] for turns in trl_arguments([row["prompt"] for row in rows], completions)[1]]
    scores = verify(completions, task=[row["task"] for row in rows], item=[row["item"] for row in rows])
    return {
        "task": name,
        "options": options,
        "n": len(rows),
        "mean_score": sum(scores) / len(scores),
        "solved": sum(score == 1.0 for score in scores) / len(scores),
        "tagged": sum("<answer>" in c and "</answer>" in c for c in completions) / len(completions),
        "seconds": round(time.perf_counter() - started, 1),
        "example": completions[0][:200],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tasks", nargs="+", help="reasoning-gym task names")
    parser.add_argument("--config", default="{}", help="YAML mapping {task: {option: value}} of task options")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="model.name_or_path")
    parser.add_argument("--n", type=int, default=50, help="held-out items per task")
    parser.add_argument("--seed", type=int, default=0, help="task.task_seed")
    parser.add_argument("--answer-start", default=None, help="task.task_answer_start, e.g. '<answer>'")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=25)
    args = parser.parse_args()
    options = yaml.safe_load(args.config) or {}
    import torch

    from hydrappo.config import ModelConfig
    from hydrappo.storage.models import load_model_and_tokenizer

    torch.set_grad_enabled(False)
    model, tokenizer = load_model_and_tokenizer(ModelConfig(name_or_path=args.model))
    for name in args.tasks:
        print(json.dumps(measure(model, tokenizer, name, options.get(name, {}), args)), flush=True)


if __name__ == "__main__":
    main()
