"""Benchmarks: ``gatepool bench NAME`` calls ``gatepool.lab.bench.NAME.run(quick)`` and ``.table(record)``.

The benches time with ``torch.utils.benchmark``, which imports ``torch.utils.cpp_extension``; on torch's
CUDA build without a CUDA runtime (``.venv-vision`` on a CPU machine) that import logs a warning, "No CUDA
runtime is found, using CUDA_HOME=…", a line about the machine that is not the bench's. Its logger is set
to errors only here, before any bench imports the timer.
"""

import logging

logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
