"""Images per split and class, summed across shards: combined across workers in the job
(SumLabelCounts), or over the results in one process; less what rewritten shards dropped."""

import apache_beam as beam

from beam_pipeline.store import catalog


def sum_label_counts(results, into=None):
    """ShardResults -> {split: {class: images}} (adding to `into`)."""
    counts = {} if into is None else into
    for r in results:
        if r.split is not None:
            add_counts(counts, {r.split: r.sums.label_counts})
    return counts


def add_counts(into, counts):
    """Add {split: {class: images}} `counts` into `into`."""
    for split, by_label in counts.items():
        target = into.setdefault(split, {})
        for label, n in by_label.items():
            target[label] = target.get(label, 0) + n


def minus_dropped(label_counts, before, after):
    """Combined counts, less the rows that rewritten shards dropped (read from the original
    fragment of each rewritten shard: only with --drop_content_duplicates and the like)."""
    counts = {split: dict(c) for split, c in label_counts.items()}
    for old, new in zip(before, after):
        if old is new:
            continue
        split = counts.setdefault(old.split, {})
        for table in catalog.iter_tables(old.files.catalog_temp, columns=["label"]):
            for label in table["label"].to_pylist():
                split[label] = split.get(label, 0) - 1
        add_counts(counts, {new.split: new.sums.label_counts})
    return counts


class SumLabelCounts(beam.CombineFn):
    """ShardResults -> {split: {class: images}}, combined across workers, so no process ever
    holds every shard's counts (with 20k classes, thousands per shard)."""

    def create_accumulator(self):
        return {}

    def add_input(self, accumulator, result):
        return sum_label_counts((result,), accumulator)

    def merge_accumulators(self, accumulators):
        merged = {}
        for accumulator in accumulators:
            add_counts(merged, accumulator)
        return merged

    def extract_output(self, accumulator):
        return accumulator
