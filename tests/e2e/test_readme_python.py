"""README's Python example runs as written (from a scratch folder, the tiny model's path made
absolute) and leaves what its comments say: a run folder and a model plain transformers loads."""

import os
import re
import subprocess
import sys

import pytest

from runs import ROOT


def readme_python_block() -> str:
    text = (ROOT / "README.md").read_text()
    marker = text.index("<!-- python-example:")
    return re.search(r"```python\n(.*?)```", text[marker:], re.S).group(1)


@pytest.mark.slow
def test_the_readme_python_example_trains_saves_and_reloads(tmp_path):
    code = readme_python_block().replace('"examples/tiny/model"', repr(str(ROOT / "examples" / "tiny" / "model")))
    code += "\nprint('loaded', type(model).__name__)\n"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "loaded LlamaForCausalLM" in result.stdout
    run = tmp_path / "runs" / "python"
    assert (run / "checkpoint-5").is_dir() and len((run / "metrics.jsonl").read_text().splitlines()) == 5
    assert (run / "policy" / "config.json").is_file()
