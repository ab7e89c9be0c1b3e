"""A GGUF model file -> a float32 safetensors model folder (model and tokenizer) that transformers and
hydrappo load: the same conversion as `hydrappo export from-gguf SOURCE --out DIR`
(hydrappo/storage/export_command.py run_export, over storage/models.py gguf_to_safetensors), as a script.

    python tools/gguf_to_safetensors.py smollm2-135m-instruct --out models/smollm2    # a bundled model
    python tools/gguf_to_safetensors.py path/to/model.gguf --out models/mine
    python tools/gguf_to_safetensors.py path/to/folder --gguf-file model-q8_0.gguf --out models/mine

The other direction, a checkpoint or a transformers folder -> one .gguf file, is tools/export_gguf.py.
An existing --out is kept unless --overwrite (then moved to a sibling NAME.previous-<time>, never deleted).
"""

from __future__ import annotations

import argparse
import os
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="GGUF file -> safetensors model folder (float32, with the tokenizer).",
        epilog="The same conversion as `hydrappo export from-gguf`; the other way is tools/export_gguf.py.",
    )
    parser.add_argument("source", help="a bundled model's name, a .gguf file, or a directory with --gguf-file")
    parser.add_argument("--gguf-file", help="the GGUF file inside the source directory")
    parser.add_argument("--out", required=True, help="the safetensors model folder to write (new or empty)")
    parser.add_argument(
        "--overwrite", action="store_true", help="move an existing --out to NAME.previous-<time> and write"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from hydrappo.errors import HydrappoError
    from hydrappo.storage.export_command import run_export

    try:
        run_export("gguf", args)
    except HydrappoError as error:
        print(f"gguf_to_safetensors.py: {error}", file=sys.stderr)
        return error.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
