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

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    from hydrappo.cli import main as hydrappo

    return hydrappo(['export', 'gguf', *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
