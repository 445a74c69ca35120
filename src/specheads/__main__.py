import sys

from specheads.cli import main

sys.exit(main())
