"""What both engines share: the face a replica shows the cluster, routers and the run
(`base.Replica`), a call in flight (`call.Call`), the step clock (`clock.step_end`), the
agent metadata a request carries (`job_meta`) and the policy's host (`policy_host.PolicyHost`:
the view, pins and their rules, victim order, finish statistics). Imports only kv and hardware."""
