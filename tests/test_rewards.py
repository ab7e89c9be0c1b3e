import textwrap

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification

from hydrappo.config import RewardArgs
from hydrappo.config.reward_sources import SOURCE_KINDS
from hydrappo.rewards import SOURCE_CLASSES, ClassifierReward, FunctionReward, RewardError, build_reward_source

from tiny import FLOAT64_ATOL, tiny_config, tiny_model, tiny_tokenizer

PROMPTS = ["w1 w2", "w3", "w4 w5 w6"]
OUTPUTS = [" w7", " w8 w9 w10", ""]
SAMPLES = [p + o for p, o in zip(PROMPTS, OUTPUTS)]

REWARD_MODULE = textwrap.dedent(
    """
    import math
    from math import sqrt

    import numpy as np
    import torch

    LIMIT = 3

    def word_count(*, samples, prompts, outputs, **metadata):  # keyword-only, as trlX calls it
        assert all(s == p + o for s, p, o in zip(samples, prompts, outputs))
        return [len(o.split()) for o in outputs]

    def as_numpy(samples, prompts, outputs):
        return np.array([len(s) for s in samples])

    def as_column(samples, prompts, outputs):
        return torch.ones(len(samples), 1) * 2

    def as_tuple(samples, prompts, outputs):
        return tuple(0.5 for _ in samples)

    def too_few(samples, prompts, outputs):
        return [1.0]

    def non_finite(samples, prompts, outputs):
        return [1.0, math.nan, math.inf][: len(samples)]

    def forgot_return(samples, prompts, outputs):
        len(samples)

    def words(samples, prompts, outputs):
        return ["high" for _ in samples]

    class Helper:
        pass
    """
)


def call(source):
    return source(SAMPLES, PROMPTS, OUTPUTS)


@pytest.fixture
def module_dir(tmp_path):
    (tmp_path / "hp_test_rewards_mod.py").write_text(REWARD_MODULE)
    return tmp_path


def test_function_from_module(module_dir, monkeypatch):
    monkeypatch.syspath_prepend(str(module_dir))
    scores = call(FunctionReward("hp_test_rewards_mod:word_count"))
    assert scores.dtype == torch.float32 and scores.tolist() == [1.0, 3.0, 0.0]


def test_function_from_file_relative_to_cwd_or_base_dir(module_dir, monkeypatch, tmp_path_factory):
    monkeypatch.chdir(module_dir)
    assert call(FunctionReward("hp_test_rewards_mod.py:as_numpy")).tolist() == [float(len(s)) for s in SAMPLES]
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    with pytest.raises(RewardError, match="does not exist"):
        FunctionReward("hp_test_rewards_mod.py:as_numpy")
    source = FunctionReward("hp_test_rewards_mod.py:as_column", base_dir=module_dir)
    assert call(source).tolist() == [2.0, 2.0, 2.0]
    absolute = FunctionReward(f"{module_dir / 'hp_test_rewards_mod.py'}:as_tuple")
    assert call(absolute).tolist() == [0.5, 0.5, 0.5]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("no_colon", "not of the form 'path/to/file.py:name' or 'package.module:name'"),
        ("module:", "not of the form"),
        (":function", "not of the form"),
        ("module:not-a-name", "not of the form"),
        ("hp_no_such_module_xyz:f", "not importable from sys.path"),
        ("missing/file.py:f", "does not exist"),
        ("hp_test_rewards_mod.py:nope", r"has no 'nope'; callables it defines: Helper, as_column, as_numpy"),
        ("hp_test_rewards_mod.py:LIMIT", "'LIMIT' is not callable \\(it is int 3\\)"),
    ],
)
def test_function_spec_errors(module_dir, monkeypatch, spec, message):
    monkeypatch.chdir(module_dir)
    with pytest.raises(RewardError, match=message) as error:
        FunctionReward(spec)
    assert "sqrt" not in str(error.value)  # imported names are not the module's own


def test_missing_dependency_inside_the_module_is_not_hidden(tmp_path, monkeypatch):
    (tmp_path / "hp_test_needs_dep.py").write_text("import hp_missing_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        RewardError,
        match="failed to import: ModuleNotFoundError: No module named "
        "'hp_missing_dependency_xyz' \\(hp_test_needs_dep.py, line 1\\)",
    ) as error:
        FunctionReward("hp_test_needs_dep:f")
    assert isinstance(error.value.__cause__, ModuleNotFoundError)  # kept for --debug's traceback


@pytest.mark.parametrize(
    "name, message",
    [
        ("too_few", r"shape \(1,\) for 3 samples"),
        ("non_finite", r"non-finite scores for 2 sample\(s\), at rows: 1 \(nan\), 2 \(inf\)"),
        ("forgot_return", "returned None"),
        ("words", "returned list that is not numbers"),
    ],
)
def test_bad_function_results(module_dir, name, message):
    source = FunctionReward(f"{module_dir / 'hp_test_rewards_mod.py'}:{name}")
    with pytest.raises(RewardError, match=message):
        call(source)


def save_classifier(directory, num_labels, pad_token_id=0, family="llama"):
    torch.manual_seed(0)
    config = tiny_config(family, num_layers=2, num_labels=num_labels)
    config.pad_token_id = pad_token_id
    model = AutoModelForSequenceClassification.from_config(config).eval()
    model.save_pretrained(directory)
    tiny_tokenizer().save_pretrained(directory)
    return model


def direct_scores(model, samples, label):
    """The model's own logits, one unpadded sample at a time."""
    tokenizer = tiny_tokenizer()
    with torch.no_grad():
        return [model(torch.tensor([tokenizer(s)["input_ids"]])).logits[0, label].item() for s in samples]


SAMPLES_OF_MANY_LENGTHS = ["w1", "w2 w3 w4 w5 w6 w7", "w8 w9 w10", "w11 w12 w13 w14", "w15 w2"]


# GPT-2's absolute positions make scores depend on the padding side (Llama's RoPE does not).
@pytest.mark.parametrize(
    "family, num_labels, label, pad_token_id",
    [("llama", 1, -1, 0), ("llama", 3, 0, 0), ("llama", 3, -1, None), ("gpt2", 2, -1, 0)],
)
def test_classifier_scores_equal_unpadded_logits(tmp_path, family, num_labels, label, pad_token_id):
    model = save_classifier(tmp_path, num_labels, pad_token_id, family)
    source = ClassifierReward(str(tmp_path), label=label, batch_size=2)  # batches of unequal lengths
    # Both models in float64: padded batches and single rows agree within FLOAT64_ATOL (tests/helpers/tiny.py),
    # and the scores, rounded to float32 on the way out, within one float32 spacing of the value more.
    source.model.double()
    scores = source(SAMPLES_OF_MANY_LENGTHS, SAMPLES_OF_MANY_LENGTHS, [""] * 5)
    assert scores.dtype == torch.float32 and scores.shape == (5,)
    expected = np.array(direct_scores(model.double(), SAMPLES_OF_MANY_LENGTHS, label))
    bound = np.spacing(np.abs(expected).astype(np.float32)) + FLOAT64_ATOL
    assert np.all(np.abs(scores.numpy().astype(np.float64) - expected) <= bound), (scores, expected)
    assert len(set(np.round(expected, 6))) == 5  # the scores really differ per sample


def test_classifier_errors(tmp_path):
    with pytest.raises(RewardError, match="does not exist"):
        ClassifierReward(str(tmp_path / "missing"))
    tiny_model("llama", num_layers=1).save_pretrained(tmp_path / "causal")
    with pytest.raises(RewardError, match="no trained classification head"):
        ClassifierReward(str(tmp_path / "causal"))
    save_classifier(tmp_path / "rm", num_labels=2)
    with pytest.raises(RewardError, match="reward_model_label=2 is out of range for a model with 2 label"):
        ClassifierReward(str(tmp_path / "rm"), label=2)


def test_each_reward_source_kind_has_one_class():
    # the config's table of kinds (which options name a source) and the classes that build them
    assert [row.kind for row in SOURCE_KINDS] == list(SOURCE_CLASSES) == ["function", "model", "branch"]


def test_build_reward_source(module_dir, tmp_path):
    branch = build_reward_source(RewardArgs(use_reward_branch=True))
    assert branch.names == ["reward_branch"] and branch(
        ["a"], ["a"], [""], branch_scores=torch.tensor([2.5])
    ).total.tolist() == [2.5]
    function = build_reward_source(RewardArgs(reward_fn="hp_test_rewards_mod.py:word_count"), base_dir=module_dir)
    assert function.names == ["word_count"] and call(function).total.tolist() == [1.0, 3.0, 0.0]
    save_classifier(module_dir / "rm", num_labels=2)
    classifier = build_reward_source(RewardArgs(reward_model="rm", reward_model_label=0), base_dir=module_dir)
    assert isinstance(classifier.entries[0][2], ClassifierReward) and classifier.entries[0][2].label == 0
    with pytest.raises(RewardError, match="no reward source is set"):  # the words of the config check
        build_reward_source(RewardArgs())
    with pytest.raises(RewardError, match=r"reward.reward_weights=\[1.0\] has 1 weight.* for 2 reward source"):
        build_reward_source(
            RewardArgs(reward_fn="hp_test_rewards_mod.py:word_count", use_reward_branch=True, reward_weights=[1.0]),
            base_dir=module_dir,
        )
