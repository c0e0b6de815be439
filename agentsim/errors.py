"""The one error type for bad user input anywhere in the project.

It sits below every package (traces, policies, sim and calibrate import it; it imports
nothing) so that all of them and the CLI can raise and catch it. The CLI prints
`error: <message>` and exits 2 — so a message must fit on one line and say what is
wrong *and* how to fix it.
"""


class InputError(ValueError):
    """Bad trace, profile, flag or metadata; the message is shown to the user as is."""


class SimulationError(RuntimeError):
    """A simulation that cannot go on: a deadlock, or a loop that no longer advances the
    simulated clock (the progress watchdog). The message is one line naming the state
    (what waits, runs, is pinned and for whom, free blocks); the CLI prints it and exits
    2, sweeps and the planner mark the point failed and go on."""
