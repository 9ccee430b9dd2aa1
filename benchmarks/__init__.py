"""Benchmark scripts: each prints a markdown table of what it measured on this machine."""
