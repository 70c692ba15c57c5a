"""fully_shard: FSDP2 per-parameter sharding."""
