"""The scripts behind the docs' tables and figures, and the speed and fidelity checks. Each
runs as `python benchmarks/NAME.py` from the repository root and imports as
`benchmarks.NAME` (the tests do); points run through sim.study.sweep's workers (`map_points`)."""
