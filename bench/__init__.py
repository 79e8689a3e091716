"""Benchmarks: each prints its numbers as a script, and `rows()` feeds bench/run_all.py's one table.

The `rows()` protocol is described in bench/run_all.py.
"""
