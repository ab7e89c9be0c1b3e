"""A verifiable reward for the tiny example's vocabulary: 1.0 when the response's FIRST word
is a "good" word (g0..g7), else 0.0. A random tiny model scores about 0.13."""


def first_word_is_good(samples, prompts, outputs, **kwargs):
    return [1.0 if text.split()[:1] and text.split()[0].startswith("g") else 0.0 for text in outputs]
