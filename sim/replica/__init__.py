"""What both engines share: the face a replica shows the cluster, routers and the run
(`base.Replica`), a call in flight (`call.Call`), the step clock (`clock.step_end`) and the
agent metadata a request carries (`job_meta`). Imports only kv and hardware."""
