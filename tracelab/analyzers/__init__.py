"""Package placeholder; filled in by its owner."""
