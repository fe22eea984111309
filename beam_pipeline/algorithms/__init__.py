"""Plain algorithms with no knowledge of images or datasets: the external merge sort the
launcher and commit use (spill)."""
