"""Runs on Beam workers: shard writing, records, images, commit. No TensorFlow, picklable, idempotent."""
