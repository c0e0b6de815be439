"""The SimPy replica: the simulator's own model of vLLM 0.32's scheduler (`scheduler.Scheduler`)
in an event-driven engine (`engine.SimpyReplica`). Never imports vllm_replica."""
