"""Fault harness and doubles: the simulated engine that tests, demos and benchmarks use."""
