"""The stable name of the scheduler classes that vLLM loads (`--scheduler-cls
sim.vllm_scheduler.PolicyScheduler`, `scheduler_cls=` in users' scripts): they live in
sim/vllm_replica/scheduler.py."""
from sim.vllm_replica.scheduler import AsyncPolicyScheduler, PolicyScheduler

__all__ = ["AsyncPolicyScheduler", "PolicyScheduler"]
