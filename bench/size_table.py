"""The table the size benchmarks print: each figure at every size, wall and CPU seconds, and the
ratio of the largest size to the smallest, so growth shows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Figures = Mapping[str, tuple[float, float, str]]  # label -> (wall s, CPU s, note)


def print_sizes(title: str, unit: str, sizes: Sequence[int], results: Mapping[int, Figures]) -> None:
    """A Markdown table of `results` (size -> figures) and the notes below it."""
    small, big = sizes[0], sizes[-1]
    print(f"\n| {title} | " + " | ".join(f"{n} {unit}: wall s | CPU s" for n in sizes)
          + (f" | {big}/{small} wall | {big}/{small} CPU |" if len(sizes) > 1 else " |"))
    print("| --- |" + " --- | --- |" * len(sizes) + (" --- | --- |" if len(sizes) > 1 else ""))
    for label in results[small]:
        cells = [f"{results[n][label][0]:.2f} | {results[n][label][1]:.2f}" for n in sizes]
        ratios = ([f"{results[big][label][0] / max(results[small][label][0], 1e-9):.1f}",
                   f"{results[big][label][1] / max(results[small][label][1], 1e-9):.1f}"] if len(sizes) > 1 else [])
        print(f"| {label} | " + " | ".join(cells + ratios) + " |")
    print()
    for n in sizes:
        for label, (_, _, note) in results[n].items():
            if note:
                print(f"  {n} {unit}, {label}: {note}")
