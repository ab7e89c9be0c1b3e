"""trlX hydra checkpoints both ways, as a script: trlX -> hydrappo (the default, `hydrappo export trlx`,
storage/trlx.py convert_trlx) and with --to trlx hydrappo -> trlX (`hydrappo export to-trlx`,
storage/trlx.py convert_to_trlx); both through hydrappo/storage/export_command.py run_export.

    python tools/convert_trlx.py trlx_ckpt/ --out converted/checkpoint-0 --write-base converted/base
    python tools/convert_trlx.py trlx_ckpt/pytorch_model.bin --config base/ --out CKPT --base-model base/
    python tools/convert_trlx.py outputs/run --to trlx --out trlx_ckpt/

trlX's state dict (AutoModelForCausalLMWithHydraValueHead) holds base_model.* (the trained policy), v_head.*
(the value head) and frozen_head.* (the reference's top layers, final norm and lm_head). --write-base writes
the model a converted checkpoint trains on; --to trlx writes pytorch_model.bin, config.json and the
tokenizer, and prints the num_layers_unfrozen trlX loads it with. An existing --out is kept unless
--overwrite (then moved to a sibling NAME.previous-<time>, never deleted).
"""

from __future__ import annotations

import argparse
import os
import sys

TO_HYDRAPPO_ONLY = ("write_base", "config", "num_layers_unfrozen")  # options of trlX -> hydrappo alone
TO_TRLX_ONLY = ("device",)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="trlX hydra checkpoint -> hydrappo checkpoint (default), or hydrappo -> trlX (--to trlx).",
        epilog="The same conversions as `hydrappo export trlx` and `hydrappo export to-trlx` (their --help).",
    )
    parser.add_argument(
        "source",
        help="a trlX checkpoint (a directory or a weights file); with --to trlx, a hydrappo checkpoint-<step> "
        "folder or a run's output_dir (its newest)",
    )
    parser.add_argument("--to", choices=("hydrappo", "trlx"), default="hydrappo", help="the format to write")
    parser.add_argument("--out", required=True, help="the checkpoint directory to write (new or empty)")
    parser.add_argument("--write-base", help="trlX -> hydrappo: write the base model directory here")
    parser.add_argument(
        "--base-model",
        help="trlX -> hydrappo: the model trlX started from (needed without a frozen head); --to trlx: the "
        "checkpoint's base model, if it moved since training",
    )
    parser.add_argument("--config", help="trlX -> hydrappo: the model's config.json or its directory")
    parser.add_argument("--tokenizer", help="the tokenizer directory (default: the source's)")
    parser.add_argument("--num-layers-unfrozen", type=int, help="trlX -> hydrappo: N, without a frozen head")
    parser.add_argument("--max-shard-size", default="5GB", help="trlX -> hydrappo: largest shard of --write-base")
    parser.add_argument("--device", help="--to trlx: where the model is rebuilt (default cpu)")
    parser.add_argument(
        "--overwrite", action="store_true", help="move an existing --out to NAME.previous-<time> and write"
    )
    args = parser.parse_args(argv)
    wrong = TO_TRLX_ONLY if args.to == "hydrappo" else TO_HYDRAPPO_ONLY
    given = [f"--{name.replace('_', '-')}" for name in wrong if getattr(args, name) is not None]
    if given:
        parser.error(f"{', '.join(given)} do not apply with --to {args.to}")
    if args.to == "trlx":
        args.device = args.device or "cpu"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from hydrappo.errors import HydrappoError
    from hydrappo.storage.export_command import run_export

    try:
        run_export("trlx" if args.to == "hydrappo" else "to-trlx", args)
    except HydrappoError as error:
        print(f"convert_trlx.py: {error}", file=sys.stderr)
        return error.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
