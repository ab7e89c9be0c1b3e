"""Convert a GGUF model to a float32 safetensors model directory (model + tokenizer).

The result loads with plain `AutoModelForCausalLM.from_pretrained(DIR)` and
`AutoTokenizer.from_pretrained(DIR)` (chat template, pad/EOS tokens kept), in about a
second instead of dequantising the GGUF on every load. hydrappo does this by itself,
once, into its cache ($HYDRAPPO_CACHE); use this script for a directory of your own.

    python tools/convert_gguf.py smollm2-135m-instruct --out models/smollm2
    python tools/convert_gguf.py path/to/model.Q4_1.gguf --out models/mine
    python tools/convert_gguf.py path/to/dir --gguf-file model.gguf --out models/mine --overwrite

Exit code 2 on bad input (missing source, non-empty --out without --overwrite).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(argv: list[str] | None = None) -> int:
    from hydrappo.models import BUNDLED_MODELS

    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "source", help=f"a bundled name ({', '.join(BUNDLED_MODELS)}), a .gguf file, or a directory with --gguf-file"
    )
    parser.add_argument("--gguf-file", default=None, help="GGUF file inside the source directory")
    parser.add_argument("--out", required=True, help="output model directory (created)")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    from hydrappo.models import ModelLoadError, gguf_to_safetensors, resolve_model_source

    try:
        directory, gguf_file = resolve_model_source(args.source, args.gguf_file)
        if gguf_file is None:
            raise ModelLoadError(f"{args.source!r} is a model directory without a .gguf file: nothing to convert.")
        start = time.perf_counter()
        out = gguf_to_safetensors(directory, gguf_file, args.out, overwrite=args.overwrite)
    except ModelLoadError as error:
        print(f"convert_gguf: {error}", file=sys.stderr)
        return 2
    print(f"converted {Path(directory) / gguf_file} -> {out} in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
