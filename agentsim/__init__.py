"""The top layer: the `sim` command line (agentsim/cli.py), above traces, policies, sim and calibrate."""
