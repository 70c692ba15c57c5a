"""FSDP: fully sharded data parallel (FSDP2 fully_shard and the FSDP1 configuration API)."""
