"""`python -m specheads.train RECIPE.yaml [key=value ...]` (the form `accelerate launch -m` uses): `specheads train`."""

import sys

from specheads.cli import main

sys.argv.insert(1, "train")
sys.exit(main())
