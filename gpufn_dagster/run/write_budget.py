"""How long one pass of a waiting path (the watcher's tick, the embedded queue's pass) may spend
writing to the Dagster instance, and what it left for the next pass.

Every write a pass makes -- a run's tags, its wait event, its estimate -- follows from what the pass
observed and the run's tags, so a write left out is decided again, the same way, on the next pass:
nothing is lost by stopping. 10,000 runs starting to wait at once would otherwise hold one pass for
minutes of storage round trips (about 33 ms a run on PostgreSQL), past the sensor's deadline.
The pass writes what matters most first (`capacity.write_order`) and counts what it left.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

# Seconds of writes per pass: with the Kubernetes API's 10 s (client.TICK_DEADLINE) and the reads, a
# watcher tick stays well inside Dagster's 60 s sensor evaluation timeout.
WRITE_SECONDS = 20.0
# The embedded queue's pass: the queue daemon launches runs after it, so it writes for less.
QUEUE_PASS_WRITE_SECONDS = 5.0


@dataclass
class WriteBudget:
    """The writes one pass may still make: until `until` (a `time.monotonic()` moment; None: no limit).

    >>> budget = WriteBudget(time.monotonic() - 1)
    >>> budget.allows(), budget.allows(), budget.left_out
    (False, False, 2)
    >>> WriteBudget(None).allows()
    True
    """

    until: float | None
    left_out: int = field(default=0)

    @classmethod
    def seconds(cls, seconds: float | None) -> WriteBudget:
        """A budget of `seconds` from now (None: unlimited)."""
        return cls(None if seconds is None else time.monotonic() + seconds)

    def allows(self) -> bool:
        """Whether one more run's writes fit; each refusal is counted as a run left for the next pass."""
        if self.until is None or time.monotonic() < self.until:
            return True
        self.left_out += 1
        return False
