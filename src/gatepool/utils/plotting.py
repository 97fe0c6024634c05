"""Figures as files: pyplot without a display, and PNGs written atomically.

    plt = pyplot()                               # matplotlib.pyplot on the Agg backend
    fig, ax = plt.subplots()
    save_png(fig, "out/figure.png", dpi=110)     # the whole PNG or the old file, never half of one

matplotlib is imported on the first call, not with this module.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from gatepool.utils.io import atomic_write_bytes

__all__ = ["pyplot", "save_png"]


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig: Any, path: str | os.PathLike, *, dpi: int = 100, close: bool = True) -> Path:
    """Write matplotlib figure ``fig`` to ``path`` as a PNG (tight bounding box), atomically.

    ``close`` (default) closes the figure after, so a loop drawing many figures keeps no memory.
    """
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    if close:
        pyplot().close(fig)
    return atomic_write_bytes(path, buf.getvalue())
