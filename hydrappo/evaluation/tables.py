"""generate's and compare's side-by-side tables: for a terminal, as markdown, as HTML, and written to a
file (.md, .html or .jsonl rows), from the scored rows of each model by column name."""

from __future__ import annotations

import json
import logging
import statistics
from pathlib import Path

from ..storage.rundir import move_aside

logger = logging.getLogger("hydrappo.evaluation")


def mean_score(rows: list[dict]) -> float | None:
    scores = [row["score"] for row in rows if row["score"] is not None]
    return statistics.fmean(scores) if scores else None


def side_by_side_markdown(columns: dict[str, list[dict]]) -> str:
    """A markdown table: one row per prompt, a response and score column per model."""

    def cell(text) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    names = list(columns)
    header = "| prompt | " + " | ".join(f"{name} | score" for name in names) + " |"
    lines = [header, "|" + " --- |" * (1 + 2 * len(names))]
    for index, first in enumerate(columns[names[0]]):
        parts = [cell(first["prompt"])]
        for name in names:
            row = columns[name][index]
            parts += [cell(row["response"]), "" if row["score"] is None else f"{row['score']:.3f}"]
        lines.append("| " + " | ".join(parts) + " |")
    means = [mean_score(columns[name]) for name in names]
    lines.append("| **mean** | " + " | ".join(f" | {'' if m is None else f'**{m:.3f}**'}" for m in means) + " |")
    return "\n".join(lines)


def side_by_side_text(columns: dict[str, list[dict]], width: int = 60) -> str:
    """The same comparison for a terminal: blocks per prompt, then the means."""
    import textwrap

    out = []
    for index, first in enumerate(columns[next(iter(columns))]):
        out.append(f"[{index + 1}] {first['prompt']}")
        for name, rows in columns.items():
            row = rows[index]
            score = "" if row["score"] is None else f"{row['score']:+.3f}"
            wrapped = textwrap.fill(row["response"].strip().replace("\n", " "), width) or "(empty)"
            out.append(textwrap.indent(f"{name} {score}\n{textwrap.indent(wrapped, '  ')}", "    "))
        out.append("")
    for name, rows in columns.items():
        value = mean_score(rows)
        out.append(f"mean score {name}: {'n/a' if value is None else f'{value:.3f}'} over {len(rows)} prompts")
    return "\n".join(out)


def side_by_side_html(columns: dict[str, list[dict]]) -> str:
    import html

    names = list(columns)
    head = "<tr><th>prompt</th>" + "".join(f"<th>{html.escape(n)}</th><th>score</th>" for n in names) + "</tr>"
    rows = []
    for index, first in enumerate(columns[names[0]]):
        cells = [f"<td>{html.escape(first['prompt'])}</td>"]
        for name in names:
            row = columns[name][index]
            score = "" if row["score"] is None else f"{row['score']:.3f}"
            cells += [f"<td>{html.escape(row['response'])}</td>", f"<td>{score}</td>"]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    means = "".join(
        f"<td></td><td><b>{'' if mean_score(columns[n]) is None else f'{mean_score(columns[n]):.3f}'}</b></td>"
        for n in names
    )
    rows.append(f"<tr><td><b>mean</b></td>{means}</tr>")
    return f"<table border=1 cellpadding=4>\n{head}\n" + "\n".join(rows) + "\n</table>\n"


def write_comparison(columns: dict[str, list[dict]], path: Path, overwrite: bool = False) -> None:
    """The comparison as a .jsonl (a row per model and prompt), .html or markdown table file.
    A file already there is moved to a sibling NAME.previous-<time> (`overwrite`, checked
    before: check_arguments), never overwritten."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if overwrite and path.exists():
        logger.warning("--output: the existing %s was moved to %s", path, move_aside(path))
    if path.suffix == ".html":
        path.write_text(side_by_side_html(columns))
    elif path.suffix == ".jsonl":
        with path.open("w") as handle:
            for name, rows in columns.items():
                for row in rows:
                    handle.write(json.dumps({"model": name, **row}) + "\n")
    else:
        path.write_text(side_by_side_markdown(columns) + "\n")
