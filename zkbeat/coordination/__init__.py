"""Who leads: ZooKeeper sessions, the election per shard, liveness, and the replicas' line."""
