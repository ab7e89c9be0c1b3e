"""Reward of the tiny example: the fraction of response words that are "good" (g0..g7)."""


def reward_fn(samples, prompts, outputs, **kwargs):
    scores = []
    for text in outputs:
        words = text.split()
        scores.append(sum(word.startswith("g") for word in words) / len(words) if words else 0.0)
    return scores
