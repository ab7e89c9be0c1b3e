"""`python -m hydrappo ...`: the same as the `hydrappo` command (torchrun and accelerate launch need a module)."""

import sys

from .cli import main

sys.exit(main())
