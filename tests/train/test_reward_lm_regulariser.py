"""GRM's regulariser on the reward branch (train.lm_loss_weight; Yang et al. 2024, arXiv 2406.10216): the
chosen answers' LM loss read from the branch's hidden states by the frozen LM head, added to the ranking loss."""

import pytest
import torch

from hydrappo import HydraModel
from hydrappo.config import ModelConfig
from hydrappo.data import pack_sequences
from hydrappo.storage.models import load_model_and_tokenizer
from hydrappo.train.reward_model import RewardTrainer

from runs import TINY, reward_config
from tiny import FLOAT64_ATOL


def test_a_fresh_branchs_log_probs_are_the_models_own():
    """A new branch is a copy of the top layers and of the final norm, so its LM log-probs are those of the
    plain transformers model, in float64: the branch pass reads the hidden states the LM head expects."""
    torch.manual_seed(0)
    model, tokenizer = load_model_and_tokenizer(
        ModelConfig(name_or_path=str(TINY / "model"), random_init=True), dtype=torch.float64
    )
    hydra = HydraModel(model, 2)
    branch = hydra.new_reward_branch(trainable=True, own_norm=True)
    prompts, responses = [[5, 6, 7], [8]], [[9, 10], [11, 12, 13]]
    ids, mask, action_mask, width = pack_sequences(prompts, responses, tokenizer.pad_token_id)
    split = hydra.split_hidden_states(ids, mask)
    scores, logprobs = hydra.reward_scores(split, ids, mask, branch, response_start=width, logprob_rows=2)
    assert scores.shape == (2,)
    with torch.no_grad():
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits
    expected = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    response = action_mask.bool()
    torch.testing.assert_close(
        logprobs[:, width - 1 :][response], expected[:, width - 1 :][response], atol=FLOAT64_ATOL, rtol=0
    )


@pytest.mark.slow
def test_the_regularised_branch_learns_the_chosen_answers_language(tmp_path):
    config = reward_config(tmp_path, dtype="float64", max_steps=20, epochs=2, lm_loss_weight=1.0, learning_rate=3e-2)
    history = RewardTrainer(config, config_dir=tmp_path).train()
    lm = [row["train/lm_loss"] for row in history if "train/lm_loss" in row]
    assert len(lm) == 20 and all(value > 0 for value in lm)
    assert sum(lm[-3:]) / 3 < sum(lm[:3]) / 3 - 0.1, lm  # the chosen answers grow likelier under the LM head
    (tmp_path / "plain").mkdir()
    plain = RewardTrainer(
        reward_config(tmp_path / "plain", dtype="float64", max_steps=2, epochs=1), config_dir=tmp_path
    )
    assert all("train/lm_loss" not in row for row in plain.train())  # off by default
