"""The supervised stages' cache of the frozen trunk (train/stage.py SplitCache): an example whose
tokens begin another's (a conversation's rows, one per assistant turn) reads its states from the
longer one's instead of being computed, and they are the states it has alone (float64)."""

import torch

from hydrappo import HydraModel
from hydrappo.train.stage import SplitCache, covering_examples

from tiny import FLOAT64_ATOL, tiny64


def test_covering_examples_by_hand():
    tokens = {"a": (1, 2), "b": (1, 2, 3), "c": (1, 2, 3, 4), "d": (1, 5), "e": (2,), "f": (5, 1, 2)}
    assert covering_examples(tokens) == {"a": "c", "b": "c", "c": "c", "d": "d", "e": "e", "f": "f"}
    assert covering_examples({"x": (3, 4), "y": (3, 4)}) in ({"x": "y", "y": "y"}, {"x": "x", "y": "x"})


def test_an_example_that_begins_another_reads_its_states_from_it():
    hydra = HydraModel(tiny64("llama"), num_layers_unfrozen=2)
    # A conversation's rows (prompt so far, the next turn), another example, and one that only
    # shares a start with the conversation.
    turn1, tool1, turn2 = [10, 11, 12], [13, 14], [15, 16, 17]
    examples = {
        ("train", 0): ([5, 6, 7], turn1),
        ("train", 1): ([5, 6, 7, *turn1, *tool1], turn2),
        ("train", 2): ([8, 9], [20, 21]),
        ("eval", 0): ([5, 6, 7], [30, 31]),
    }
    computed_rows = []
    run = hydra.split_hidden_states

    def counted(input_ids, attention_mask=None):
        computed_rows.append(input_ids.shape[0])
        return run(input_ids, attention_mask)

    hydra.split_hidden_states = counted
    cache = SplitCache(hydra, enabled=True)
    cache.fill(examples, pad_token_id=0, chunk_size=8)

    assert sum(computed_rows) == 3  # ("train", 0) is the start of ("train", 1): not computed
    for key, (prompt, response) in examples.items():
        alone = run(torch.tensor([prompt + response]))[0]
        assert cache.rows[key].shape == alone.shape
        torch.testing.assert_close(cache.rows[key], alone, atol=FLOAT64_ATOL, rtol=0)
