"""One shard's leadership: a term plans, claims (fenced) and publishes its shard's due ticks."""
