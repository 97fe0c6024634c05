"""Benchmarks: ``gatepool bench NAME`` calls ``gatepool.bench.NAME.run(quick)`` and ``.table(record)``."""
