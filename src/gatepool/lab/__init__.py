"""The lecture lab: experiments (one file per experiment, named as it), what they share (``common``), the
harness that checks their claims, the resumable ``reproduce`` run, its report, and the benchmarks. Only
the CLI imports this package."""
