"""Benchmarks: scripts that print figures and ratios against a same-run baseline."""
