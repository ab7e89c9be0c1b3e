"""The dependency rule, read from the source: every import in hydrappo/ (function-level ones
too), resolved to modules. The package is built in layers, each of which may import only its own
layer and those below it: the idea (model/: the hydra) and the math (algo/: pure functions) at
the bottom, then the options (config/), then what the loops use (generation, rewards, data,
storage, planner), then held-out evaluation (evaluation/), then the loops (train/), and the command line on top. Arrows point down the
layers, never up, and there is no cycle between modules:

    cli -> train -> evaluation -> {generation, rewards, data, storage, planner} -> config -> {model, algo} -> errors

model/ imports torch, transformers and peft only (besides the standard library); algo/ torch only."""

import ast
import sys
from pathlib import Path

import pytest

from runs import ROOT

PACKAGE = ROOT / "hydrappo"

LAYERS = {  # module prefix -> rank; a module may import only modules of its rank or below
    "hydrappo.errors": 0,
    "hydrappo.usercode": 0,  # loading and calling user code (rewards, tools, environments): imports errors only
    "hydrappo.console": 0,  # the command's output streams
    "hydrappo.model": 1,
    "hydrappo.algo": 1,
    "hydrappo.config": 2,
    "hydrappo.data": 3,
    "hydrappo.prompts": 3,
    "hydrappo.preferences": 3,  # preference pairs in TRL's formats: read by data.py's reader
    "hydrappo.generation": 3,  # generation/serving.py imports vllm inside functions: an optional extra
    "hydrappo.rewards": 3,
    "hydrappo.agent": 3,  # tools, environments, the tool-call format: user code through usercode
    "hydrappo.storage": 3,
    "hydrappo.planner": 3,
    "hydrappo.tasks": 3,  # a reasoning-gym task: prompts (prompts.py) and a reward source (rewards/)
    "hydrappo.evaluation": 4,  # held-out answering and scoring, generate / compare: below the loops
    "hydrappo.train": 5,
    "hydrappo.study": 5,  # the examples' studies: trains through the command line, measures with train/'s pieces
    "hydrappo.cli": 6,
    "hydrappo.__main__": 6,
    "hydrappo": 6,  # the package's __init__: the public API, importing the trainers lazily
}
THIRD_PARTY = {
    "hydrappo.model": {"torch", "transformers", "peft"},
    "hydrappo.algo": {"torch"},
}
# One module may import one more library: the quantized frozen trunk is bitsandbytes' modules
# put into the hydra's bottom layers (imported inside functions: an optional dependency).
THIRD_PARTY_EXTRA = {"hydrappo.model.quantize": {"bitsandbytes"}}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def rank(name: str) -> int:
    prefix = max((p for p in LAYERS if name == p or name.startswith(p + ".")), key=len)
    return LAYERS[prefix]


def imports_of(name: str) -> tuple[set[str], set[str]]:
    """(hydrappo modules, top-level third-party packages) that module `name` imports anywhere."""
    tree = ast.parse(MODULES[name].read_text())
    package = name if is_package(name) else name.rpartition(".")[0]
    internal, external = set(), set()

    def add(target: str) -> None:
        while target and target not in MODULES:  # `from x import attribute`: the module is x
            target = target.rpartition(".")[0]
        internal.add(target)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                (add if alias.name.split(".")[0] == "hydrappo" else external.add)(
                    alias.name if alias.name.split(".")[0] == "hydrappo" else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                target = f"{base}.{node.module}" if node.module else base
            elif node.module.split(".")[0] == "hydrappo":
                target = node.module
            else:
                external.add(node.module.split(".")[0])
                continue
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                add(submodule if submodule in MODULES else target)
    internal.discard(name)
    return internal, external


GRAPH = {name: imports_of(name)[0] for name in MODULES}


def test_every_module_has_a_layer():
    for name in MODULES:
        assert any(name == p or name.startswith(p + ".") for p in LAYERS), f"{name} has no layer in LAYERS"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_arrows_point_down(name):
    for target in GRAPH[name]:
        assert rank(target) <= rank(name), f"{name} (layer {rank(name)}) imports {target} (layer {rank(target)})"
    if name not in ("hydrappo.__main__",):
        assert "hydrappo.cli" not in GRAPH[name] or name == "hydrappo.cli", f"{name} imports the CLI"


@pytest.mark.parametrize("layer", sorted(THIRD_PARTY))
def test_the_idea_and_the_math_import_only_their_libraries(layer):
    allowed = THIRD_PARTY[layer] | set(sys.stdlib_module_names) | {"__future__"}
    for name in MODULES:
        if name == layer or name.startswith(layer + "."):
            _, external = imports_of(name)
            extra = THIRD_PARTY_EXTRA.get(name, set())
            assert external <= allowed | extra, f"{name} imports {sorted(external - allowed - extra)}"


def test_no_import_cycle():
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        path.append(name)
        for target in sorted(GRAPH[name]):
            if state.get(target) == 1:
                cycle = path[path.index(target) :] + [target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        path.pop()
        state[name] = 2

    for name in sorted(MODULES):
        if name not in state:
            visit(name)


def test_the_reader_sees_function_level_imports():
    """The rule holds for imports inside functions too (they once hid a cycle)."""
    # Every command imports its module inside its function, so that `hydrappo --help` is quick.
    assert {"hydrappo.evaluation.compare", "hydrappo.storage.export_command", "hydrappo.planner.command"} <= GRAPH[
        "hydrappo.cli"
    ]
    assert {"hydrappo.train.ppo", "hydrappo.train.reward_model", "hydrappo.train.sft"} <= GRAPH[
        "hydrappo.train.command"
    ]
    assert "hydrappo.storage.models" in GRAPH["hydrappo.train.harness"]


# One limit for every module, as ruff formats them: a module that outgrows it is split where its
# meaning splits (config/options.py, stage_options.py and sections.py are one such split), never
# squeezed back under it.
MODULE_LINE_LIMIT = 700


def test_modules_stay_small():
    for path in MODULES.values():
        lines = len(path.read_text().splitlines())
        assert lines <= MODULE_LINE_LIMIT, f"{path.relative_to(PACKAGE.parent)} has {lines} lines; split it by meaning"


# One limit for every function: past it, a function is split where its meaning splits
# (tools/lab/long_functions.py lists the longest).
FUNCTION_LINE_LIMIT = 120


def test_functions_stay_short():
    too_long = []
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                where = f"{path.relative_to(PACKAGE.parent).as_posix()}:{node.name}"
                if lines > FUNCTION_LINE_LIMIT:
                    too_long.append(f"{where} ({lines} lines)")
    assert not too_long, f"functions over {FUNCTION_LINE_LIMIT} lines: {too_long}; split them by meaning"
