"""Many runs: sweeps (`sweep`), capacity planning (`plan`) and their figures (`plot`)."""
