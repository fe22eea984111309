"""Tools around the job, not steps of it: verify, inspect, sample_data, the --sink beam sink."""
