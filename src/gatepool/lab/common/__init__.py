"""Code two or more experiments share (their setups, trainings and measurements), one module per family."""
