"""What a tick is: its slot, name, misfire grace, catch-up and jitter, the same on every replica (no ZooKeeper here)."""
