"""A reward function is user code: sys.exit() or KeyboardInterrupt inside it is a clear error
naming the function and the step, not a quiet exit 0; a thread it leaves running does not keep
the process alive once training ends (hydrappo/usercode.py)."""

import signal
import subprocess
import sys
import threading

import pytest

from hydrappo import usercode
from hydrappo.cli import main

from runs import FAST_SMALL, ROOT, TINY


def train(tmp_path, body: str) -> list[str]:
    (tmp_path / "user_reward.py").write_text(body)
    return [
        "train",
        str(TINY / "config.yaml"),
        "--output_dir",
        str(tmp_path / "out"),
        "--reward_fn",
        f"{tmp_path / 'user_reward.py'}:reward_fn",
        *FAST_SMALL,
    ]


@pytest.mark.parametrize(
    ("statement", "said"),
    [
        ("sys.exit(0)", "called sys.exit(0) (SystemExit)"),
        ("sys.exit()", "called sys.exit() (SystemExit)"),
        ("raise KeyboardInterrupt", "raised KeyboardInterrupt"),
    ],
)
def test_exit_or_interrupt_inside_a_reward_function_is_an_error_naming_it_and_the_step(
    tmp_path, capsys, statement, said
):
    argv = train(tmp_path, f"import sys\n\n\ndef reward_fn(samples, prompts, outputs, **kwargs):\n    {statement}\n")
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"reward function '{tmp_path / 'user_reward.py'}:reward_fn' at step 1 {said}" in err, err
    assert not list((tmp_path / "out").glob("checkpoint-*"))


def test_the_same_under_a_time_limit_where_the_function_runs_in_a_thread(tmp_path, capsys):
    argv = train(tmp_path, "import sys\n\n\ndef reward_fn(samples, prompts, outputs, **kwargs):\n    sys.exit(3)\n")
    assert main([*argv, "--timeout_s", "60"]) == 1
    assert "at step 1 called sys.exit(3) (SystemExit)" in capsys.readouterr().err


def test_call_passes_results_and_other_errors_through():
    assert usercode.call(lambda a, b=0: a + b, "f", 1, b=2) == 3
    with pytest.raises(ValueError, match="boom"):
        usercode.call(lambda: (_ for _ in ()).throw(ValueError("boom")), "f")


def test_only_argparses_own_exit_becomes_exit_2(capsys):
    assert main(["train", "--no_such_option_anywhere"]) == 2
    assert main(["train", "--help"]) == 0
    capsys.readouterr()


def test_non_daemon_threads_user_code_leaves_running_are_noted():
    stop = threading.Event()
    usercode.call(lambda: threading.Thread(target=stop.wait, name="left-running").start(), "reward function 'x'")
    usercode.call(lambda: threading.Thread(target=stop.wait, daemon=True).start(), "reward function 'y'")
    try:
        assert [(t.name, what) for t, what in usercode.threads_left_behind()] == [
            ("left-running", "reward function 'x'")
        ]
    finally:
        stop.set()
        usercode.LEFT_BEHIND.clear()


@pytest.mark.slow
def test_a_thread_left_running_by_the_reward_function_does_not_keep_the_process_alive(tmp_path):
    argv = train(
        tmp_path,
        "import threading, time\n\n\ndef reward_fn(samples, prompts, outputs, **kwargs):\n"
        "    threading.Thread(target=time.sleep, args=(3600,), name='poller').start()\n"
        "    return [0.0] * len(outputs)\n",
    )
    done = subprocess.run(
        [sys.executable, "-m", "hydrappo", *argv], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert "done: step 1" in done.stdout
    assert "1 thread(s) started by user code still running: 'poller' (started by the reward function" in done.stderr
    assert (tmp_path / "out" / "checkpoint-1").is_dir()


# --------------------------------------------------------------------------- the reward module's import
@pytest.mark.parametrize(
    ("body", "said"),
    [
        (
            "import sys\nsys.exit(0)\n",
            "called sys.exit(0) (SystemExit) while it was imported; code the trainer runs must not end",
        ),
        (
            "import argparse\nargparse.ArgumentParser().parse_args()\n",
            "called sys.exit(2) (SystemExit) while it was imported (argparse: it parsed the command line",
        ),
        ("raise KeyboardInterrupt\n", "raised KeyboardInterrupt while it was imported; code the trainer runs must not"),
    ],
)
def test_exit_argparse_or_interrupt_at_import_is_an_error_of_the_reward_module(
    tmp_path, capsys, monkeypatch, body, said
):
    argv = train(
        tmp_path, body + "\n\ndef reward_fn(samples, prompts, outputs, **kwargs):\n    return [0.0] * len(outputs)\n"
    )
    monkeypatch.setattr(sys, "argv", ["hydrappo", *argv])  # what argparse in the module reads
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"hydrappo train: reward function file '{tmp_path / 'user_reward.py'}' {said}" in err, err
    assert not list((tmp_path / "out").glob("*checkpoint*"))


def test_a_real_ctrl_c_while_the_reward_module_imports_stays_a_ctrl_c(tmp_path, capsys):
    # Python's own SIGINT handler, as in a terminal: a shell starts a background job (`cmd &`)
    # with SIGINT ignored, and Python then installs no handler, so Ctrl-C cannot reach the run.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        argv = train(tmp_path, "import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(5)\n")
        assert main(argv) == 130
    finally:
        signal.signal(signal.SIGINT, previous)
    err = capsys.readouterr().err
    assert "interrupted (Ctrl-C)" in err, err
    assert "KeyboardInterrupt while it was imported" not in err  # not blamed on the module


@pytest.mark.parametrize("spec", ["file", "module"])
def test_non_daemon_threads_started_at_import_are_noted(tmp_path, monkeypatch, spec):
    from hydrappo.rewards import FunctionReward

    stop = threading.Event()
    (tmp_path / "threaded_reward.py").write_text(
        "import threading\nSTOP = threading.Event()\nthreading.Thread(target=STOP.wait, name='import-poller').start()\n"
        "\n\ndef reward_fn(samples, prompts, outputs, **kwargs):\n    return [0.0] * len(outputs)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    name = f"{tmp_path / 'threaded_reward.py'}:reward_fn" if spec == "file" else "threaded_reward:reward_fn"
    try:
        reward = FunctionReward(name)
        stop = reward.fn.__globals__["STOP"]
        [(thread, what)] = usercode.threads_left_behind()
        assert thread.name == "import-poller" and what.endswith("(at import)") and "reward function " in what
    finally:
        stop.set()
        usercode.LEFT_BEHIND.clear()
        sys.modules.pop("threaded_reward", None)


@pytest.mark.slow
def test_a_thread_started_when_the_reward_module_is_imported_does_not_keep_the_process_alive(tmp_path):
    argv = train(
        tmp_path,
        "import threading, time\nthreading.Thread(target=time.sleep, args=(3600,), name='poller').start()\n"
        "\n\ndef reward_fn(samples, prompts, outputs, **kwargs):\n    return [0.0] * len(outputs)\n",
    )
    done = subprocess.run(
        [sys.executable, "-m", "hydrappo", *argv], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert "done: step 1" in done.stdout
    assert (
        f"1 thread(s) started by user code still running: 'poller' (started by the reward function file "
        f"'{tmp_path / 'user_reward.py'}' (at import)); hydrappo exits without waiting for them"
    ) in done.stderr


PYTHON_API = """
import threading
from hydrappo import PPOTrainer

STOP = threading.Event()

def reward_fn(completions, **kwargs):
    if not any(t.name == "poller" for t in threading.enumerate()):
        threading.Thread(target=STOP.wait, name="poller").start()
    return [0.0] * len(completions)

trainer = PPOTrainer(model={model!r}, reward_funcs=[reward_fn], train_dataset=[{{"prompt": "n1 n2"}}] * 8, args={{
    "model": {{"random_init": True}}, "generation": {{"max_new_tokens": 4}},
    "ppo": {{"batch_size": 4, "mini_batch_size": 4, "ppo_epochs": 1}},
    "train": {{"output_dir": {out!r}, "total_steps": 1, "progress_bar": False}}}})
trainer.train()
print("trained", flush=True)
STOP.set()  # what the warning asks for: end the thread (the program would wait for it forever)
"""


@pytest.mark.slow
def test_the_python_api_names_threads_left_running_when_train_returns(tmp_path):
    script = PYTHON_API.format(model=str(TINY / "model"), out=str(tmp_path / "out"))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0 and "trained" in done.stdout, done.stderr
    assert (
        "1 thread(s) started by user code still running: 'poller' (started by the reward function '__main__:reward_fn' "
        "at step 1); this Python program will not end until they do"
    ) in done.stderr, done.stderr
