"""python -m hydrappo.study report | measure: one table from several study folders, or checkpoints
measured on held-out prompts at several sampling seeds."""

from __future__ import annotations

import sys

USAGE = (
    "usage: python -m hydrappo.study report OUT.md OUT.png DIR [DIR ...]\n"
    "       python -m hydrappo.study measure CHECKPOINT [CHECKPOINT ...] --prompts P --reward_fn R [--seeds S ...]\n"
    "(`python -m hydrappo.study report --help` and `measure --help` list each one's options)"
)


def main(argv: list[str] | None = None) -> int:
    """report | measure; --help prints the usage (exit 0), anything else prints it as an error."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["report"]:
        from .sweeps import report_main

        return report_main(argv[1:])
    if argv[:1] == ["measure"]:
        from .measure import measure_main

        return measure_main(argv[1:])
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__.split("\n\n")[0] + "\n\n" + USAGE)
        return 0
    print(USAGE, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
