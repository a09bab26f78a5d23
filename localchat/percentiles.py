"""The one percentile used for every reported speed figure: turn timings (``itl_p50_ms``,
``itl_p95_ms`` on the local and the remote route alike), ``localchat stats`` and ``bench``.

Linear interpolation between the two nearest ranks (numpy's default, ``statistics.quantiles``'
"inclusive" method): the p50 of an even count is the mean of the middle two, and a p95 over few
values lies between the two largest instead of jumping to the maximum.
"""

from __future__ import annotations

from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (``q`` in 0..100) of ``values``; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
