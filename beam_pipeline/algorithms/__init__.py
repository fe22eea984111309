"""Plain algorithms with no knowledge of images or datasets: the external merge sort the
launcher and commit use (spill) and the ordered read-ahead of the shard writer, commit and
the launcher (read_ahead)."""
