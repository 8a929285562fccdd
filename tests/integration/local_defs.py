"""A code location for the embedded-slots tests: a GPU Function on class `default` that holds its
slot until the test opens its gate, one on class `l4`, a CPU Function, and one on class `default`
that holds at a row the test names (`halting`), all on table `docs`.

Each `docs__slow` step draws the next ticket (1, 2, ...) when it starts computing -- the order in
which steps got class default's slot -- and finishes once the test opens that ticket's gate.
"""

import os
import time
from pathlib import Path

from gpufn_dagster import build_definitions, gpu_function


_ticket: int | None = None


def _draw_ticket(gates: Path) -> int:
    for number in range(1, 1000):
        try:
            os.close(os.open(gates / f"ticket-{number}", os.O_CREAT | os.O_EXCL))
            return number
        except FileExistsError:
            continue
    raise RuntimeError("out of tickets")


def held_upper(text: str) -> str:
    global _ticket
    gates = Path(os.environ["GPUFN_TEST_GATES"])
    if _ticket is None:
        _ticket = _draw_ticket(gates)
    deadline = time.monotonic() + 300  # a hang guard only: the test opens the gate
    while not ((gates / f"open-{_ticket}").exists() or (gates / "open-all").exists()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return f"{text.upper()}@{os.environ.get('CUDA_VISIBLE_DEVICES')}"


def halting(text: str) -> str:
    """Each row at once, logged to the gates' `halting-calls`, except the row the gate file `halt-at`
    names: that one holds until `open-all` (a run terminated there shows how fast a call stops)."""
    gates = Path(os.environ["GPUFN_TEST_GATES"])
    with open(gates / "halting-calls", "a") as calls:
        calls.write(f"{text}\n")
    halt = gates / "halt-at"
    deadline = time.monotonic() + 300  # a hang guard only
    while halt.exists() and halt.read_text() == text and not (gates / "open-all").exists() \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    return text.upper()


def reversed_text(text: str) -> str:
    return text[::-1]


def length(text: str) -> int:
    return len(text)


slow = gpu_function(table="docs", column="slow", gpu_class="default", batch_size=2)(held_upper)
other = gpu_function(table="docs", column="reversed", gpu_class="l4")(reversed_text)
size = gpu_function(table="docs", column="size")(length)  # no class: a CPU Function
halted = gpu_function(table="docs", column="halted", gpu_class="default", batch_size=2, adapt_batch_size=False,
                      checkpoint_seconds=0)(halting)
defs = build_definitions(assets=[slow, other, size, halted])
