"""The `hydrappo` command: the table of sub-commands, the dispatch and the mapping of errors to
exit codes. Each command's arguments are parsed beside the code it drives (train/command.py,
train/layer_sweep.py, storage/export_command.py, planner/command.py; evaluation/options.py for generate and compare).
Nothing imports this module (the layering test checks it); `python -m hydrappo` and the
`hydrappo` script start here.

    hydrappo train CONFIG.yaml [--resume [PATH]] [--option value ...]      PPO
    hydrappo reward CONFIG.yaml [--resume [PATH]] [--option value ...]     a reward branch
    hydrappo sft CONFIG.yaml [--resume [PATH]] [--option value ...]        supervised fine-tuning
    hydrappo generate CHECKPOINT [--prompts FILE]                          base vs trained, scored
    hydrappo compare A B ... [--prompts FILE]                              several models, scored
    hydrappo export CHECKPOINT --out DIR|FILE.gguf | export trlx|to-trlx|from-gguf ...
    hydrappo memory MODEL | --largest | --validate                        the GPU memory planner
    hydrappo sweep-layers CONFIG.yaml [--layers A:B] [--steps K] [--window W] one layer at a time, ranked

An error hydrappo raises on purpose (hydrappo.errors.HydrappoError) is printed as its
message alone, with exit code 2 for a usage error and 1 for a failure while running; an
operating-system error (a full disk, a permission) is printed the same way with exit code 1,
and anything else as one line that says it is unexpected. `--debug` anywhere on the command
line, or HYDRAPPO_DEBUG=1, prints the traceback too. Training stopped by SIGINT or SIGTERM
exits with 130 or 143 (train/interrupt.py).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import traceback
from pathlib import Path

from . import console, usercode
from .config.command_line import parse_options
from .console import launcher_process
from .errors import HydrappoError, describe_os_error, on_the_command_line
from .train.command import STAGES, stage_command


# ---------------------------------------------------------------------------- generate, compare
def generate_command(argv: list[str]) -> int:
    from .evaluation.compare import check_arguments, generate
    from .evaluation.options import GenerateOptions

    args = parse_options(
        GenerateOptions,
        argv,
        prog="hydrappo generate",
        description="Generate with a checkpoint's policy (and its base model) for a prompts file, score the responses "
        "and print them side by side with the mean score of each.",
    )
    check_arguments(
        output=args.output,
        inputs={"the checkpoint": args.checkpoint, "--prompts": args.prompts},
        overwrite=args.overwrite,
    )
    columns = generate(
        args.checkpoint,
        args.prompts,
        args.prompt_column,
        args.reward_fn,
        args.limit,
        args.max_new_tokens,
        args.temperature,
        args.no_base,
        args.seed,
        trust_checkpoint_code=args.trust_checkpoint_code,
        reward_weights=args.reward_weights,
        greedy=args.greedy,
    )
    return _show(columns, args)


def compare_command(argv: list[str]) -> int:
    from .evaluation.compare import check_arguments, compare
    from .evaluation.options import CompareOptions

    args = parse_options(
        CompareOptions,
        argv,
        prog="hydrappo compare",
        description="Several models (base, SFT, PPO checkpoints, exported directories) on the same prompts, with "
        "the same sampling seed: responses and reward scores side by side, and the mean score of each.",
    )
    check_arguments(
        output=args.output,
        inputs={"--prompts": args.prompts, **{model: model.rpartition("=")[2] for model in args.models}},
        overwrite=args.overwrite,
    )
    columns = compare(
        args.models,
        args.prompts,
        args.prompt_column,
        args.reward_fn,
        args.chat_template,
        args.limit,
        args.max_new_tokens,
        args.temperature,
        args.max_prompt_length,
        args.seed,
        trust_checkpoint_code=args.trust_checkpoint_code,
        reward_weights=args.reward_weights,
        greedy=args.greedy,
    )
    return _show(columns, args)


def _show(columns, args) -> int:
    """generate's and compare's table, printed, and written to --output if given."""
    from .evaluation.tables import side_by_side_text, write_comparison

    print(side_by_side_text(columns))
    if args.output:
        write_comparison(columns, Path(args.output), overwrite=args.overwrite)
        print(f"wrote {args.output}")
    return 0


# ---------------------------------------------------------------------------- export, memory, sweep-layers
# Each lives beside the code it drives; imported when it runs, so that `hydrappo --help` is quick.


def export_command(argv: list[str]) -> int:
    from .storage.export_command import export_command as run_export

    return run_export(argv)


def memory_command(argv: list[str]) -> int:
    from .planner.command import memory_command as run_memory

    return run_memory(argv)


def sweep_layers_command(argv: list[str]) -> int:
    from .train.layer_sweep import sweep_layers_command as run_sweep

    return run_sweep(argv)


# ---------------------------------------------------------------------------- the command table

COMMANDS = {
    **{name: (functools.partial(stage_command, name), stage.summary) for name, stage in STAGES.items()},
    "generate": (generate_command, "a checkpoint's and its base model's responses, scored, side by side"),
    "compare": (compare_command, "several models on the same prompts, scored side by side"),
    "export": (
        export_command,
        "checkpoint -> transformers model dir, LoRA adapter or .gguf file; `export trlx` / `export from-gguf` "
        "convert into hydrappo, `export to-trlx` to trlX",
    ),
    "memory": (memory_command, "plan GPU memory per component, hydrappo vs the classic four models"),
    "sweep-layers": (
        sweep_layers_command,
        "train each layer alone for a few RL steps, rank them by held-out gain, propose a band",
    ),
}


def main(argv: list[str] | None = None) -> int:  # the program does not wait for threads user code left (usercode)
    usercode.COMMAND_LINE = True
    if argv is None:  # the program: a closed stdout or stderr (tee ended by Ctrl-C) must not stop training
        console.survive_lost_output()
    with on_the_command_line():  # messages name --options, not Python's arguments (errors.spell)
        code = _main(argv)
    return usercode.leave_threads_behind(code, end_process=argv is None)


def _main(argv: list[str] | None) -> int:
    rank, world_size = launcher_process()
    # Under a launcher only process 0 tells what it is doing; every process warns.
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    # bitsandbytes (imported by peft when installed) warns on CPUs with AVX512-BF16 that an optional
    # kernel package is missing; hydrappo pins its quantized modules to the path that does not use it.
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("HYDRAPPO_DEBUG", "") not in ("", "0")
    argv = [arg for arg in argv if arg != "--debug"]
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        width = max(map(len, COMMANDS))
        lines = [f"  {name:<{width}}  {help_text}" for name, (_, help_text) in COMMANDS.items()]
        print("usage: hydrappo COMMAND [ARGS]\n\nRLHF on one transformer trunk.\n\ncommands:\n" + "\n".join(lines))
        if argv and argv[0] not in ("-h", "--help"):
            print(f"\nhydrappo: unknown command {argv[0]!r}", file=sys.stderr)
            return 2
        return 0 if argv else 2
    command = COMMANDS[argv[0]][0]
    prog = f"hydrappo {argv[0]}" + (f" (process {rank} of {world_size})" if world_size > 1 else "")
    code = 1
    try:
        code = command(argv[1:])
        return code
    except usercode.ParserExit as done:  # one of our parsers' (--help, a usage error it printed)
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 2)
    except SystemExit as done:  # anyone else's (user code a check did not wrap): an error
        last = traceback.extract_tb(done.__traceback__)[-1]
        return _fail(
            prog, f"sys.exit({done.code!r}) was called ({Path(last.filename).name}, line {last.lineno}).", 1, debug
        )
    except HydrappoError as error:  # raised on purpose, with a message that says what to fix: show just that
        return _fail(prog, str(error), error.exit_code, debug)
    except KeyboardInterrupt:
        return _fail(prog, "interrupted (Ctrl-C).", 130, debug)
    except Exception as error:  # a bug, or a case no check knows yet: one line, the traceback with --debug
        described = describe_os_error(error)
        if described is not None or isinstance(error, OSError):
            # The operating system refused something (a full disk, a permission): not a bug.
            reason, fix = described or (error.strerror.lower() if error.strerror else str(error), "check the path")
            paths = [os.fsdecode(p) for p in (getattr(error, "filename", None), getattr(error, "filename2", None)) if p]
            where = (
                f" at {' -> '.join(paths)}" if paths else ""
            )  # (a path given as bytes, e.g. by TensorBoard, as text)
            return _fail(
                prog,
                f"the operating system refused a file operation{where}: {reason}; {fix}. Files "
                "written completely before it are intact.",
                1,
                debug,
            )
        return _fail(
            prog,
            f"unexpected error: {type(error).__name__}: {error}. This is a bug (or a case hydrappo "
            "does not check yet): rerun with --debug for the traceback and report it.",
            1,
            debug,
        )
    finally:
        if "torch.distributed" in sys.modules:  # a command that ran under a launcher
            from .train.distributed import end_process_group

            end_process_group(succeeded=code == 0)


def _fail(prog: str, message: str, code: int, debug: bool) -> int:
    """Print an error as one line (every process of a launcher run prints its own); the traceback with --debug."""
    if debug:
        traceback.print_exc()
    elif code == 1 and "--debug" not in message:
        message += " (--debug shows the traceback)"
    print(f"{prog}: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
