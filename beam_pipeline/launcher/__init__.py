"""Runs where the build starts: options, listing, planning, the shard index."""
