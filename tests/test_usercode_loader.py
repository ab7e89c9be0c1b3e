"""The one user-code loader (usercode.load_object): while a run's code loads (one_module_per_file,
around train/inputs.read_inputs) every `file.py:name` a config names is imported once per file, so a
reward function and an environment named from the same file share one module (its classes and its
module-level state), whichever loads it first; the next run imports its files afresh."""

import textwrap

import pytest

from hydrappo import usercode
from hydrappo.agent.toolbox import AgentSetupError, load_object
from hydrappo.errors import RewardError
from hydrappo.rewards import FunctionReward, load_reward_function

TASK = """
CALLS = []


class Game:
    def reset(self, **row):
        CALLS.append("reset")
        return "start"

    def move(self, step: int) -> str:
        \"\"\"Make a move.

        Args:
            step: How far.
        \"\"\"
        return str(step)


def score(prompts, completions, environments=None, **kwargs):
    return [float(isinstance(env, Game)) for env in environments]
"""


def write(folder, text, name="task.py"):
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def test_a_reward_and_an_environment_from_one_file_share_its_module(tmp_path):
    path = write(tmp_path, TASK)
    with usercode.one_module_per_file():
        reward = FunctionReward(f"{path}:score")
        game_class = load_object(f"{path}:Game", None, "agent.environment_factory")
    assert reward.fn.__globals__ is vars(__import__("sys").modules[game_class.__module__])
    game = game_class()
    game.reset()
    scored = reward(["x"], ["p"], ["c"], columns={"environments": [game]})
    assert scored.tolist() == [1.0]  # isinstance(env, Game) holds: one class, not two copies
    assert reward.fn.__globals__["CALLS"] == ["reset"]  # module-level state is shared


def test_the_same_file_by_another_path_is_the_same_module(tmp_path, monkeypatch):
    path = write(tmp_path, TASK)
    monkeypatch.chdir(tmp_path)
    with usercode.one_module_per_file():
        by_relative = load_object("task.py:Game", None, "agent.tools")
        by_config_dir = load_object("task.py:Game", tmp_path, "agent.tools")
        assert by_relative is by_config_dir is load_object(f"{path}:Game", None, "x")
    assert load_object(f"{path}:Game", None, "x") is not by_relative  # the next run imports the file afresh


def test_a_run_reads_its_inputs_with_one_module_per_file(tmp_path, monkeypatch):
    from hydrappo.train import inputs

    seen = []
    monkeypatch.setattr(inputs, "read_rl_inputs", lambda config: seen.append(usercode._FILE_MODULES) or "read")
    assert inputs.read_inputs(__import__("hydrappo.config", fromlist=["Config"]).Config()) == "read"
    assert seen == [{}] and usercode._FILE_MODULES is None


def test_a_changed_file_is_imported_again(tmp_path):
    path = write(tmp_path, "VALUE = 1\ndef value(prompts, completions, **kw):\n    return [VALUE]\n")
    with usercode.one_module_per_file():
        first = load_reward_function(f"{path}:value")
        write(tmp_path, "VALUE = 2\ndef value(prompts, completions, **kw):\n    return [VALUE]\n")
        second = load_reward_function(f"{path}:value")
    assert first is not second and second(["p"], ["c"]) == [2]


@pytest.mark.parametrize("error, load", [(RewardError, load_reward_function), (AgentSetupError, load_object)])
def test_each_caller_gets_its_own_error(tmp_path, error, load):
    path = write(tmp_path, TASK)
    args = (f"{path}:missing",) if load is load_reward_function else (f"{path}:missing", None, "agent.tools")
    with pytest.raises(error, match=r"has no 'missing'; callables it defines: Game, score"):
        load(*args)


def test_resolve_path_looks_beside_the_config_first(tmp_path, monkeypatch):
    (tmp_path / "config").mkdir()
    write(tmp_path / "config", "X = 1\n", "beside.py")
    monkeypatch.chdir(tmp_path)
    assert usercode.resolve_path("beside.py", tmp_path / "config") == str(tmp_path / "config" / "beside.py")
    assert usercode.resolve_path("elsewhere.py", tmp_path / "config") == "elsewhere.py"  # the current directory's
    assert usercode.resolve_path(None, tmp_path) is None
