"""A hydrappo checkpoint's trained policy (LoRA merged), or a transformers model folder, as one .gguf file
for llama.cpp and Ollama: the same library function as `hydrappo export CHECKPOINT --out FILE.gguf`
(hydrappo/storage/gguf_export.py export_gguf), as a script.

    python tools/export_gguf.py outputs/run --out policy.gguf                 # the newest checkpoint, f16
    python tools/export_gguf.py outputs/run/checkpoint-100 --out policy.gguf --gguf-type q8_0
    python tools/export_gguf.py models/policy --out policy.gguf --gguf-type f32   # an exported folder

Llama-style models (SmolLM2, Llama, Mistral) and Gemma 3 are written; another family is refused in one line
before anything is written. An existing --out is kept unless --overwrite (then moved to a sibling
NAME.previous-<time>, never deleted); the file appears only when complete.
"""

from __future__ import annotations

import argparse
import os
import sys

GGUF_TYPES = ("f16", "q8_0", "f32")  # hydrappo.storage.gguf_export.GGUF_TYPES, named here so --help imports nothing


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="A hydrappo checkpoint (or a transformers model folder) -> one .gguf file for llama.cpp / Ollama.",
        epilog="Check the file against transformers with tools/check_gguf_llama_cpp.py (needs llama-cpp-python).",
    )
    parser.add_argument("source", help="a checkpoint-<step> folder, a run's output_dir (newest), or a model folder")
    parser.add_argument("--out", required=True, help="the .gguf file to write")
    parser.add_argument("--gguf-type", choices=GGUF_TYPES, default="f16", help="type of the 2-D weights (default f16)")
    parser.add_argument("--base-model", help="a checkpoint's base model, if it moved since training")
    parser.add_argument("--tokenizer", help="a checkpoint's tokenizer, if it moved since training")
    parser.add_argument("--device", default="cpu", help="where the checkpoint's model is rebuilt (default cpu)")
    parser.add_argument(
        "--overwrite", action="store_true", help="move an existing --out to NAME.previous-<time> and write"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from hydrappo.errors import HydrappoError
    from hydrappo.storage.gguf_export import export_gguf

    try:
        result = export_gguf(
            args.source,
            args.out,
            args.gguf_type,
            overwrite=args.overwrite,
            base_model=args.base_model,
            tokenizer=args.tokenizer,
            device=args.device,
        )
    except HydrappoError as error:
        print(f"export_gguf.py: {error}", file=sys.stderr)
        return error.exit_code
    size = result.path.stat().st_size / 2**20
    print(
        f"wrote {result.path} ({result.gguf_type}, GGUF arch {result.arch}, {result.tensors} tensors, {size:.1f} MiB)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
