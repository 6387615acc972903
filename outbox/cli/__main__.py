"""`python -m outbox.cli ARGS`: the `outbox` command."""

import sys

from outbox.cli import main

sys.exit(main())
