"""The vLLM replica: vLLM 0.32's own Scheduler and KV cache manager driven by the simulator's
clock (`engine.VllmReplica`), the policy adapter that vLLM loads (`scheduler.PolicyScheduler`,
also at sim.vllm_scheduler) and its offload connector. Never imports simpy_replica."""
