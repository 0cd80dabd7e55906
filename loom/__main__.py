"""`python -m loom`: the `loom` command."""

import sys

from loom.cli import main

sys.exit(main())
