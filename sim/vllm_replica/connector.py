"""The simulator's KV connector for vLLM's scheduler: how a replica that runs vLLM's own
scheduler (`--scheduler vllm`, sim/vllm_replica/engine.py) admits KV it did not compute, through the
interface vLLM admits external KV with. At a request's admission the scheduler asks
`get_num_new_matched_tokens` how many tokens past its own prefix-cache hit the connector
brings, allocates blocks for them, counts them computed, and tells the connector
(`update_state_after_alloc`). Two sources, as the SimPy replica's tier (sim/cluster/disagg.py
Inbox over sim/kv/tiers.py KVOffload):

- Prefill/decode disaggregation (NixlConnector in Dynamo's set-up): a call a prefill
  replica handed over brings its full blocks beyond the local hit, once (a call preempted
  on the decode replica recomputes there). The transfer already ran on the call's path
  (sim/cluster/cluster.py), so nothing is charged here.
- Offload tiers (`--offload`, LMCache's connector): the tiers' prefix hit beyond the local
  one (`KVOffload.loadable`), loaded synchronously and charged to the step that admits it
  (LMCache's non-layerwise retrieve completes before the forward pass). The stores
  (write-through on prefill steps, a policy's offloads) are the engine's and the adapter's.

Scheduler side only: no worker, no transfer, empty metadata.
"""
from __future__ import annotations

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata

from sim.kv.tiers import NO_TIER


class SimConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config=None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self.block_size = vllm_config.cache_config.block_size
        self.expected: dict[str, int] = {}  # request id -> tokens a prefill replica handed over
        self.received_tokens = 0  # tokens admitted from handoffs (sim/kv/tiers.py Inbox's figure)
        self.tier = NO_TIER  # the replica's offload tiers (bind)
        self.calls: dict = {}  # request id -> the simulator's record of the call (bind)
        self._lookup: tuple[str, int] | None = None  # (request id, local hit in blocks) of the last tier lookup

    def bind(self, tier, calls: dict) -> None:
        self.tier, self.calls = tier, calls

    def expect(self, request_id: str, tokens: int) -> None:
        self.expected[request_id] = tokens

    # --- scheduler side ----------------------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int, bool]:
        rid = request.request_id
        self._lookup = None
        if rid in self.expected:
            return max(0, self.expected[rid] - num_computed_tokens), False
        if not self.tier.enabled:
            return 0, False
        hit = num_computed_tokens // self.block_size
        self._lookup = (rid, hit)
        return self.tier.loadable(self.calls[rid], hit) * self.block_size, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        rid = request.request_id
        if self.expected.pop(rid, None) is not None:  # admitted: the handoff is used up
            self.received_tokens += num_external_tokens
            return
        lookup, self._lookup = self._lookup, None
        if lookup is None or lookup[0] != rid:
            return  # no tier, or a request resumed with its KV (no lookup)
        call, hit = self.calls[rid], lookup[1]
        self.tier.admitted(call, hit)
        if num_external_tokens:
            self.tier.load(call, hit, num_external_tokens // self.block_size)

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    # --- worker side: there is no worker --------------------------------------------------
    def start_load_kv(self, forward_context, **kwargs) -> None:
        raise NotImplementedError("the simulator's KV connector has no worker side")

    def wait_for_layer_load(self, layer_name: str) -> None:
        raise NotImplementedError("the simulator's KV connector has no worker side")

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs) -> None:
        raise NotImplementedError("the simulator's KV connector has no worker side")

    def wait_for_save(self) -> None:
        raise NotImplementedError("the simulator's KV connector has no worker side")
