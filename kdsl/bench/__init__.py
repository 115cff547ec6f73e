"""``kdsl bench``: backends against native PyTorch, synthesis throughput, tuners, and rediscovery."""
