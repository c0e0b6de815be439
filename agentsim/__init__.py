"""The `sim` command line (cli.py), the top layer above traces, policies, sim and calibrate;
and two base modules every layer uses, which import nothing of the project: errors.py (the
one error type for bad input) and files.py (atomic writes)."""
