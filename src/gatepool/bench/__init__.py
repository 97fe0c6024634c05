"""Benchmarks: ``gatepool bench NAME`` runs ``gatepool.bench.NAME.main(args)`` (never part of the tests)."""
