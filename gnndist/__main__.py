"""`python -m gnndist ...` (and `torchrun ... -m gnndist train ...`)."""
import sys

from gnndist.cli import main

sys.exit(main())
