"""`python -m clients.cli`: the `lineage` command."""

import sys

from clients.cli.main import main

sys.exit(main())
