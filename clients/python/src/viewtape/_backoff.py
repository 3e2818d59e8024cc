"""Full-jitter exponential backoff and `Retry-After`."""

from __future__ import annotations

import email.utils
import random
import time


class Backoff:
    """The n-th delay in a row is uniform in ``[0, min(max, base * 2**n)]``, never below a floor."""

    def __init__(self, base: float, maximum: float) -> None:
        self._base = base
        self._max = maximum
        self.attempts = 0

    def next(self, floor: float = 0.0, equal_jitter: bool = False) -> float:
        ceiling = min(self._max, self._base * 2 ** min(self.attempts, 30))
        self.attempts += 1
        jittered = ceiling / 2 + random.random() * ceiling / 2 if equal_jitter else random.random() * ceiling
        return float(max(floor, jittered))

    def reset(self) -> None:
        self.attempts = 0


def retry_after(value: str | None) -> float:
    """`Retry-After` (delta-seconds or an HTTP date) in seconds, or 0."""
    if not value:
        return 0.0
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return 0.0
    return max(0.0, when.timestamp() - time.time())
