"""`python -m outbox ARGS`: the `outbox` command (as `python -m outbox.cli`)."""

import sys

from outbox.cli import main

sys.exit(main())
