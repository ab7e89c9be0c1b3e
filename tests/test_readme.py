"""README.md and docs/ against the tree they describe: the layout block (docs/architecture.md;
README keeps the floors) names every module of the package and nothing that is gone, every
relative link of README and docs/ lands on a file and, where it names one, a heading of that
file, README stays a README (at most 12,000 characters), every tools/ script a page names exists,
docs/tools.md describes each script in tools/ and tools/lab/README.md lists each one in the lab."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from runs import ROOT

README = ROOT / "README.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"  # its layout block: every module
ENTRY = re.compile(r"^( {0,12})(\S+?(?:\.py|/))(?:\s{2,}.*)?$")  # deeper indents continue a description


def layout_block(text: str) -> list[str]:
    after = text.split("\n## Layout\n", 1)[1]
    return after.split("```\n", 2)[1].splitlines()


def layout_entries(lines: list[str]) -> set[str]:
    """The paths the block names, from its indentation: `hydrappo/`, `hydrappo/model/`, `hydrappo/model/arch.py`, ..."""
    entries, stack = set(), []  # stack of (indent, folder path)
    for line in lines:
        match = ENTRY.match(line)
        if not match:
            continue
        indent, name = len(match.group(1)), match.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = (stack[-1][1] if stack else "") + name
        entries.add(path)
        if name.endswith("/"):
            stack.append((indent, path))
    return entries


def package_paths() -> set[str]:
    paths = {"hydrappo/"}
    for path in (ROOT / "hydrappo").rglob("*"):
        if "__pycache__" in path.parts:
            continue
        relative = path.relative_to(ROOT).as_posix()
        if path.is_dir():
            paths.add(relative + "/")
        elif path.suffix == ".py" and path.name != "__init__.py":
            paths.add(relative)
    return paths


def test_the_layout_block_names_every_module_and_nothing_that_is_gone():
    entries = layout_entries(layout_block(ARCHITECTURE.read_text()))
    missing = sorted(package_paths() - entries)
    assert not missing, f"docs/architecture.md's layout block does not name: {missing}; add a line for each"
    gone = sorted(entry for entry in entries if not (ROOT / entry).exists())
    assert not gone, f"docs/architecture.md's layout block names what the tree does not hold: {gone}"


def test_the_layout_parser_reads_nesting_and_skips_descriptions():
    lines = [
        "hydrappo/",
        "  cli.py               every command",
        "  model/               THE IDEA",
        "    arch.py              find layers,",
        "                       hydra.py is not an entry here",
        "tests/      pytest",
    ]
    assert layout_entries(lines) == {
        "hydrappo/",
        "hydrappo/cli.py",
        "hydrappo/model/",
        "hydrappo/model/arch.py",
        "tests/",
    }


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {slug(match) for match in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def links(path: Path) -> list[tuple[Path, str]]:
    """(target file, anchor) of every relative markdown link in `path` to a .md file or a folder."""
    found = []
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        file, _, anchor = target.partition("#")
        found.append(((path.parent / file).resolve(), anchor))
    return found


def test_slug_follows_github():
    assert slug("The planner against measured training (CPU)") == "the-planner-against-measured-training-cpu"
    assert slug("Training with `hydrappo train`") == "training-with-hydrappo-train"
    assert slug("Critic-free RL: GRPO, Dr. GRPO") == "critic-free-rl-grpo-dr-grpo"


@pytest.mark.parametrize(
    "page", [README, *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.relative_to(ROOT).as_posix()
)
def test_every_relative_link_resolves(page):
    broken = []
    for target, anchor in links(page):
        if not target.exists():
            broken.append(f"{target.relative_to(ROOT)} (no such file)")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            broken.append(f"{target.relative_to(ROOT)}#{anchor} (no such heading)")
    assert not broken, f"{page.relative_to(ROOT)} links to {broken}"


def test_readme_stays_short():
    length = len(README.read_text())
    assert length <= 12_000, f"README.md has {length} characters (at most 12,000); the manual goes to docs/"


TOOL_PATH = re.compile(r"\btools/(?:lab/)?\w+\.py\b")
PAGES_NAMING_TOOLS = [README, *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").glob("*/README.md"))]


@pytest.mark.parametrize("page", PAGES_NAMING_TOOLS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_tools_script_a_page_names_exists(page):
    gone = sorted({path for path in TOOL_PATH.findall(page.read_text()) if not (ROOT / path).is_file()})
    assert not gone, f"{page.relative_to(ROOT)} names {gone}, which tools/ does not hold (tools/lab/ holds the lab)"


def test_docs_tools_describes_every_script_in_tools_and_the_lab_index_every_lab_script():
    described = set(TOOL_PATH.findall((ROOT / "docs" / "tools.md").read_text()))
    missing = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tools").glob("*.py"))
    missing = [path for path in missing if path not in described]
    assert not missing, f"docs/tools.md does not describe {missing}"
    index = (ROOT / "tools" / "lab" / "README.md").read_text()
    unlisted = sorted(p.name for p in (ROOT / "tools" / "lab").glob("*.py") if f"| `{p.name}` |" not in index)
    assert not unlisted, f"tools/lab/README.md's table does not list {unlisted}"
