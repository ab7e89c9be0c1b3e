"""Bounds for comparing two training runs that must end with the same weights (K processes
against one, gradient checkpointing against none): derived from the computation, not a float32
tolerance that the machine decides.

The runs train in float64 (model.dtype) with AdamW's eps at ADAM_EPS, so what differs between
them is the order of float64 sums: a sum of n terms of magnitude <= S is off by at most
dg = n * 2**-53 * S (n <= 1e4 token terms, S <= 10 here). AdamW divides by sqrt(v) + eps, which
turns dg into a weight error of at most lr * dg / eps per optimizer step (where the gradient is
near 0; elsewhere far less): weights agree within WEIGHT_NOISE * lr * steps, with a factor 10 for
the errors earlier steps feed into later ones. With the default eps 1e-8, dg / eps nears 1
(float32: far above), so a weight whose exact gradient is ~0 may move by a whole lr either way:
hence float64 and a larger eps. Logged scalars are smooth functions of weights that agree that
closely (<= 1.3e-6) with O(1) sensitivity: they agree to a relative SCALAR_NOISE; clip fractions
exactly unless a ratio lies within ~1e-7 of the clip edge (odds ~1e-4 over the few hundred
tokens here). A logic error, one token or row counted twice or missed, moves weights by about lr
per step and scalars by percents: orders of magnitude more.
"""

import torch

ADAM_EPS = 1e-6
WEIGHT_NOISE = 10 * 1e4 * 2**-53 * 10 / ADAM_EPS  # 1.1e-4
SCALAR_NOISE = 1e-6
EXACT = ["--dtype", "float64", "--adam_eps", str(ADAM_EPS)]  # the options of a run compared this way


def assert_close_weights(a: dict, b: dict, lr: float, steps: int) -> None:
    """{name: tensor} of two float64 runs after `steps` optimizer steps at learning rate `lr`."""
    assert a.keys() == b.keys() and a
    for name in a:
        assert a[name].dtype == b[name].dtype == torch.float64, name
        torch.testing.assert_close(
            a[name], b[name], atol=WEIGHT_NOISE * lr * steps, rtol=0, msg=lambda m, name=name: f"{name}: {m}"
        )
