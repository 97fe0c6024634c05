"""Benchmarks: ``gatepool bench NAME`` calls ``gatepool.lab.bench.NAME.run(quick)`` and ``.table(record)``."""
