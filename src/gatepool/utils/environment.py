"""What a number was measured on: one description, beside every result, benchmark and training record."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any


def cache_dir() -> Path:
    """gatepool's cache: ``$XDG_CACHE_HOME/gatepool``, else ``~/.cache/gatepool`` (data, built kernels)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gatepool"


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """CPU model, cores, OS, Python, torch version and the torch threads in use now."""
    import torch

    return {
        "processor": cpu_model(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
