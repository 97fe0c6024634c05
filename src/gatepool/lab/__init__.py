"""The lecture lab: experiments (one claim group per file), the harness that checks their claims, the
resumable ``reproduce`` run, its report, and the benchmarks. Only the CLI imports this package."""
