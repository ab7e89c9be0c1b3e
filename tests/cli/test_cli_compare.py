import pytest

from hydrappo.cli import main as cli_main
from hydrappo.config import parse_config
from hydrappo.storage.export import export_checkpoint
from hydrappo.train.ppo import PPOTrainer

from runs import TINY


def compare_main(argv):
    return cli_main(["compare", *argv])


@pytest.mark.slow
def test_checkpoint_and_its_export_answer_alike_side_by_side(tmp_path, capsys):
    config = parse_config(
        TINY / "config.yaml",
        [
            "--output_dir",
            str(tmp_path / "run"),
            "--total_steps",
            "2",
            "--batch_size",
            "8",
            "--mini_batch_size",
            "8",
            "--no_progress_bar",
        ],
    )
    PPOTrainer(config, config_dir=TINY).train()
    checkpoint = tmp_path / "run" / "checkpoint-2"
    exported = export_checkpoint(checkpoint, tmp_path / "exported")
    capsys.readouterr()

    html = tmp_path / "cmp.html"
    code = compare_main(
        [
            f"ppo={checkpoint}",
            f"exported={exported}",
            "--prompts",
            str(TINY / "prompts.jsonl"),
            "--limit",
            "6",
            "--output",
            str(html),
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    means = [line for line in out.splitlines() if line.startswith("mean score")]
    assert len(means) == 2 and means[0].split(":")[1].split()[0] == means[1].split(":")[1].split()[0]
    table = html.read_text()
    assert table.count("<tr>") == 1 + 6 + 1 and "<th>ppo</th>" in table and "<th>exported</th>" in table
    rows = table.split("<tr>")[2:-1]
    for row in rows:  # same seed, same policy: the same response and score from both loading paths
        cells = [cell.split("</td>")[0] for cell in row.split("<td>")[1:]]
        assert cells[1] == cells[3] and cells[2] == cells[4]
