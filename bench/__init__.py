"""Benchmarks (`make bench`): measured figures with an in-run peer for each, and JSON
results under bench/results/. Figures are reported, never asserted."""
