"""`python -m atlas.cli`, as it worked when the command line was one module (same as `python -m atlas`)."""

import sys

from atlas.cli import main

sys.exit(main())
