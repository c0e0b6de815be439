"""A run: its configuration (`config.SimConfig`, `config.build_run`, the one way to make a
`config.Run`), the workload's programs, `simulate.execute`, the metrics tables and the
early-stopping bounds."""
