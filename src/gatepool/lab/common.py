"""pyplot without a display, for the experiment files."""

from __future__ import annotations


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no display needed)."""
    import matplotlib  # lazy: matplotlib costs a second to import, and only runs that draw need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
