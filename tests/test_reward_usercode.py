"""A reward function is user code: sys.exit() or KeyboardInterrupt inside it is a clear error
naming the function and the step, not a quiet exit 0; a thread it leaves running does not keep
the process alive once training ends (hydrappo/usercode.py)."""

import subprocess
import sys
import threading

import pytest

from hydrappo import usercode
from hydrappo.cli import main
from runs import ROOT, TINY

FAST = ["--total_steps", "1", "--batch_size", "4", "--mini_batch_size", "4", "--ppo_epochs", "1", "--max_new_tokens", "4",
        "--no_progress_bar"]  # fmt: skip


def train(tmp_path, body: str) -> list[str]:
    (tmp_path / "user_reward.py").write_text(body)
    return ["train", str(TINY / "config.yaml"), "--output_dir", str(tmp_path / "out"),
            "--reward_fn", f"{tmp_path / 'user_reward.py'}:reward_fn", *FAST]  # fmt: skip


@pytest.mark.parametrize(("statement", "said"), [
    ("sys.exit(0)", "called sys.exit(0) (SystemExit)"),
    ("sys.exit()", "called sys.exit() (SystemExit)"),
    ("raise KeyboardInterrupt", "raised KeyboardInterrupt"),
])  # fmt: skip
def test_exit_or_interrupt_inside_a_reward_function_is_an_error_naming_it_and_the_step(tmp_path, capsys, statement, said):
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
        assert [(t.name, what) for t, what in usercode.threads_left_behind()] == [("left-running", "reward function 'x'")]
    finally:
        stop.set()
        usercode.LEFT_BEHIND.clear()


@pytest.mark.slow
def test_a_thread_left_running_by_the_reward_function_does_not_keep_the_process_alive(tmp_path):
    argv = train(tmp_path, "import threading, time\n\n\ndef reward_fn(samples, prompts, outputs, **kwargs):\n"
                           "    threading.Thread(target=time.sleep, args=(3600,), name='poller').start()\n"
                           "    return [0.0] * len(outputs)\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "hydrappo", *argv], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "done: step 1" in done.stdout
    assert "1 thread(s) started by user code still running: 'poller' (started by the reward function" in done.stderr
    assert (tmp_path / "out" / "checkpoint-1").is_dir()
