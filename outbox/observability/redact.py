"""Moved to `outbox.core.redact` (pure text, needed below this layer by outbox/postgres/ too).

This name stays for code written against it, as the same module (one registry of secrets).
"""

import sys

from outbox.core import redact

sys.modules[__name__] = redact
