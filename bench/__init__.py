"""Benchmarks: real processes, a real PostgreSQL, figures beside same-run baselines (`make bench`)."""
