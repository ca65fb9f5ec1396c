"""`python -m atlas` (also what `torchrun -m atlas` runs)."""

import sys

from atlas.cli import main

sys.exit(main())
