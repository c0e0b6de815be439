"""The KV handoff of prefill/decode disaggregation as a KV connector of vLLM's scheduler:
how a decode replica that runs vLLM's own scheduler (`--engine vllm`, sim/vllm_engine.py)
admits a call whose prompt a prefill replica computed (sim/disagg.py).

vLLM admits such a request through its KV connector (NixlConnector in Dynamo's set-up):
at a request's admission the scheduler asks `get_num_new_matched_tokens` how many tokens
past its own prefix-cache hit the connector brings, allocates blocks for them and counts
them computed. Here the transfer has already run on the call's path (sim/cluster.py), so
the tokens are loaded synchronously: the handed-over full blocks beyond the local hit,
once (a call preempted on the decode replica recomputes there, as the SimPy replica's
Inbox does). Scheduler side only: no worker, no transfer, empty metadata.
"""
from __future__ import annotations

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata


class HandoffConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config=None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self.expected: dict[str, int] = {}  # request id -> tokens a prefill replica handed over
        self.received_tokens = 0  # tokens admitted from handoffs (sim/disagg.py Inbox's figure)

    def expect(self, request_id: str, tokens: int) -> None:
        self.expected[request_id] = tokens

    # --- scheduler side ----------------------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int, bool]:
        return max(0, self.expected.get(request.request_id, 0) - num_computed_tokens), False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        if self.expected.pop(request.request_id, None) is not None:  # admitted: the handoff is used up
            self.received_tokens += num_external_tokens

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    # --- worker side: there is no worker --------------------------------------------------
    def start_load_kv(self, forward_context, **kwargs) -> None:
        raise NotImplementedError("the simulator's handoff connector has no worker side")

    def wait_for_layer_load(self, layer_name: str) -> None:
        raise NotImplementedError("the simulator's handoff connector has no worker side")

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs) -> None:
        raise NotImplementedError("the simulator's handoff connector has no worker side")

    def wait_for_save(self) -> None:
        raise NotImplementedError("the simulator's handoff connector has no worker side")
