"""What every bench/ row script prints: our figure, the baseline's, the ratio, each as median [min..max] over
repeats measured side by side in one run."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def spread(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.4g} [{min(values):.4g}..{max(values):.4g}]"


def report(what: str, ours: Sequence[float], base: Sequence[float], unit: str, ratio_of: str = "ours/base") -> float:
    """Prints one table row; the ratio is median(ours) / median(base) (or its inverse for 'base/ours')."""
    o, b = statistics.median(ours), statistics.median(base)
    ratio = o / b if ratio_of == "ours/base" else b / o
    print(f"{what}: ours {spread(ours)} {unit} | baseline {spread(base)} {unit} | {ratio_of} {ratio:.2f} "
          f"(n={len(ours)})", flush=True)
    return ratio


def report_paired(what: str, ours: Sequence[float], base: Sequence[float], unit: str) -> float:
    """As `report`, for a baseline measured inside the same repeat as ours: the ratio is taken per repeat
    (ours[i] / base[i]) and printed as median [min..max] of those ratios, so a slow repeat does not pair its
    figure with another repeat's baseline."""
    ratios = [o / b for o, b in zip(ours, base, strict=True)]
    ratio = statistics.median(ratios)
    print(f"{what}: ours {spread(ours)} {unit} | baseline {spread(base)} {unit} | ours/base per repeat "
          f"{spread(ratios)} (n={len(ours)})", flush=True)
    return ratio
