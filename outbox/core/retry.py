"""Retry policy: exponential backoff with a cap and jitter."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from outbox.core.errors import ConfigurationError
from outbox.core.numbers import problem


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay before attempt n+1 after n failures: initial * multiplier**(n-1), capped, jittered."""

    initial: float = 0.5
    maximum: float = 60.0
    multiplier: float = 2.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        for name in ("initial", "maximum"):
            reason = problem(getattr(self, name), "seconds")
            if reason is not None:
                raise ConfigurationError(f"backoff {name} {reason}")
        if not math.isfinite(self.multiplier):
            raise ConfigurationError(f"backoff multiplier must be >= 1, got {self.multiplier}")
        if self.maximum < self.initial:
            raise ConfigurationError(
                f"backoff maximum ({self.maximum}) must be >= initial ({self.initial})"
            )
        if self.multiplier < 1:
            raise ConfigurationError(f"backoff multiplier must be >= 1, got {self.multiplier}")
        if not 0 <= self.jitter <= 1:
            raise ConfigurationError(f"backoff jitter must be within [0, 1], got {self.jitter}")

    def delay(self, failures: int) -> float:
        """Seconds to wait after the `failures`-th consecutive failure (failures >= 1)."""
        exponent = max(failures - 1, 0)
        # Cap the exponent first so a large attempt count cannot overflow a float.
        base = self.initial * self.multiplier ** min(exponent, 64)
        base = min(base, self.maximum)
        spread = base * self.jitter
        return max(0.0, base + random.uniform(-spread, spread))
