"""A duration as a reader takes it in."""

from __future__ import annotations


def duration_text(seconds: float) -> str:
    """``42.0 s``, ``12.5 min``, ``3.2 h`` or ``1,540 days``: the unit a reader takes in at a glance."""
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:,.0f} days"
