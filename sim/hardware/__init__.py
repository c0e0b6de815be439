"""What a step costs and what a GPU holds: profiles (the step-time model and the engine
limits it was measured under), roofline estimates from public specs, checks against
measured kernels, vLLM's start-up limits, and the spec tables and bundled profiles.

Public: profile.{Profile, load_profile, parse_profile, step_features}, roofline,
check, limits, engine_config.EngineConfig, spec_tables, shipped_models, stretch.
Imports nothing else of sim."""
