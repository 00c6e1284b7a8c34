"""Benchmarks: each module runs alone with `python -m bench.<name>`."""
