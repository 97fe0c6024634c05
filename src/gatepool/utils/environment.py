"""What a number was measured on: one description, beside every result, benchmark and training record;
and the one resolver of ``device`` names (``auto`` | ``cpu`` | ``cuda`` | ``cuda:N`` | ``mps``)."""

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
    """CPU model, cores, the instruction set torch's CPU kernels use (``AVX512``, ``AVX2``, …: one CPU name
    covers both, and timings and float32 rounding differ between them), OS, Python, torch version and the
    torch threads in use now."""
    import torch

    return {
        "processor": cpu_model(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


# ----------------------------------------------------------------------------- devices

DEVICES = ("auto", "cpu", "cuda", "mps")  # and cuda:N for one GPU of several
_ALLOWED = "auto, cpu, cuda, cuda:N or mps"


def check_device(name: Any) -> str:
    """``name`` (a string, a ``torch.device`` or None = auto) as a device string, checked without torch.

    Only the spelling is checked here (the CLI's flag type); :func:`resolve_device` also checks that
    the device is there.
    """
    text = "auto" if name is None else str(name)
    base, sep, index = text.partition(":")
    if base in DEVICES and (not sep or (base == "cuda" and index.isdigit())):
        return text
    raise ValueError(f"device must be one of {_ALLOWED}, got {name!r}")


def resolve_device(name: Any = "auto"):
    """The ``torch.device`` to run on: ``auto`` (or None) is CUDA when present, else MPS, else the CPU.

    A bad name, or ``cuda``/``mps`` asked for where there is none, is a ValueError naming ``device``.
    """
    import torch

    text = check_device(name)
    cuda, mps = torch.cuda.is_available(), _mps_available()
    if text == "auto":
        if cuda:
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("mps") if mps else torch.device("cpu")
    device = torch.device(text)
    if device.type == "cuda":
        if not cuda:
            why = f"torch {torch.__version__} has no CUDA" if torch.version.cuda is None else "no GPU found"
            raise ValueError(f"device {text!r} asked for, but CUDA is not available ({why}); "
                             "use device 'cpu' or 'auto'")  # fmt: skip
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ValueError(f"device {text!r} asked for, but there are {count} CUDA devices (cuda:0 to "
                             f"cuda:{count - 1})")  # fmt: skip
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    if device.type == "mps" and not mps:
        raise ValueError(f"device {text!r} asked for, but MPS is not available here; use device 'cpu' or "
                         "'auto'")  # fmt: skip
    return device


def _mps_available() -> bool:
    import torch

    mps = getattr(torch.backends, "mps", None)
    return mps is not None and mps.is_available()


def device_info(device: Any) -> dict[str, Any]:
    """What a record says about its device: ``{"device": "cuda:0", "device_name": "NVIDIA H200"}``
    (the name for CUDA only)."""
    import torch

    device = torch.device(device)
    info: dict[str, Any] = {"device": str(device)}
    if device.type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(device)
    return info
