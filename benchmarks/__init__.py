"""outbox benchmarks: `./run bench` (or `python -m benchmarks`); see benchmarks/README.md."""
