"""`--eval_prompts ""` switches held-out evaluation off from the command line. An empty value
once resolved to the config file's folder (a folder of prompt files, so the run evaluated on every
file in it); now it stays empty, the run has no held-out prompts (a task's held-out items
included), and the file's eval_* options are not refused for having nothing to evaluate."""

from types import SimpleNamespace

from hydrappo.config import parse_config
from hydrappo.config.task import has_held_out, held_out_off

from runs import ROOT

SENTIMENT = ROOT / "examples" / "sentiment" / "config.yaml"  # eval_prompts and eval_every: 15 in the file


def test_an_empty_eval_prompts_on_the_command_line_switches_evaluation_off():
    for words in (["--eval_prompts", ""], ["--eval_prompts="]):
        config = parse_config(SENTIMENT, words)  # checked: the file's eval_every is not an error
        assert config.data.eval_prompts == ""
        assert held_out_off(config) and not has_held_out(config)
        assert config.train.eval_every == 15


def test_the_file_s_eval_prompts_still_evaluate():
    config = parse_config(SENTIMENT)
    assert config.data.eval_prompts.endswith("eval_prompts.jsonl")
    assert has_held_out(config) and not held_out_off(config)


def test_an_empty_eval_prompts_switches_a_task_s_held_out_items_off_too():
    task = SimpleNamespace(enabled=True, task_eval_size=80)
    with_task = SimpleNamespace(data=SimpleNamespace(eval_prompts=None), task=task)
    assert has_held_out(with_task)
    with_task.data.eval_prompts = ""
    assert not has_held_out(with_task)
