"""Tools around the job, not steps of it: verify, inspect_dataset, sample_data."""
