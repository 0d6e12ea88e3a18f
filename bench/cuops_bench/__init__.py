"""The benchmark harness behind bench/run.py: what it measures and why is in bench/PROTOCOL.md."""
