"""The KV cache below the policy: the GPU block pool (vLLM's prefix-cached pool) or the
radix tree (SGLang's), both behind the `KVCache` protocol; content keys of shared
prefixes; the tiers a pool offloads to and reloads from (CPU, SSD: `Tier`, `KVOffload`,
`NoTier`; a decode replica's `Inbox` of blocks received from a prefill replica).

Public: protocol.KVCache, block_pool.BlockPool, radix_cache.RadixCache,
content.ContentKeys, tiers.{TierSpec, build_tiers, parse_offload, KVOffload, NO_TIER, Inbox}.
Imports nothing else of sim."""
