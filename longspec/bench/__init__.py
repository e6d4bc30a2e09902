"""Benchmark harness: methods x generation lengths, side by side in one process."""
