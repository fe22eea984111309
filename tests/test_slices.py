"""TFDS split specs as record windows from the manifest's counts, checked against TFDS itself."""

import itertools

import pytest

from dataset_format import slices


def _tfds_windows(spec, shard_lengths):
    """What TFDS makes of `spec` over splits with these shard lengths: [(split, start, stop)]."""
    from tensorflow_datasets.core import splits as tfds_splits

    infos = {name: tfds_splits.SplitInfo(name=name, shard_lengths=lengths, num_bytes=0)
             for name, lengths in shard_lengths.items()}
    out = []
    for a in tfds_splits.AbstractSplit.from_spec(spec).to_absolute(infos):
        n = infos[a.splitname].num_examples
        start = a.from_ or 0
        stop = n if a.to is None else a.to
        out.append((a.splitname, start, max(start, stop)))
    return out


SPLITS = {"train": [3, 0, 4, 5], "test": [7], "validation": [1, 1]}  # 12, 7 and 2 records
SPECS = ["train", "test", "train[:10%]", "train[10%:]", "train[5:]", "train[:5]", "train[-3:]",
         "train[:-3]", "train[-50%:-25%]", "train[33%:67%]", "train[12.5%:]", "train[:0%]",
         "test[50%:]", "test[:50%]", "test[-1:]", "validation[:50%]", "validation[1:2]",
         "train[1shard:]", "train[:2shard]", "train[2shard]", "train[-1shard:]", "train[:-1shard]",
         "train[:10%]+test[50%:]", "train + test", "test[5:2]", "train[0:12]", "train[1_0:]"]


@pytest.mark.parametrize("spec", SPECS)
def test_windows_are_the_records_tfds_reads(spec):
    ours = slices.windows(spec, SPLITS.__getitem__)
    assert [(w.split, w.start, w.stop) for w in ours] == _tfds_windows(spec, SPLITS)


def test_percent_rounding_matches_tfds_for_every_boundary_and_size():
    """Half-to-even rounding of p * N / 100 for every whole percent on sizes 1..250."""
    for n, p in itertools.product(range(1, 251), range(-100, 101, 7)):
        lengths = {"train": [n]}
        for spec in (f"train[:{p}%]", f"train[{p}%:]"):
            ours = slices.windows(spec, lengths.__getitem__)
            assert [(w.split, w.start, w.stop) for w in ours] == _tfds_windows(spec, lengths), spec


@pytest.mark.parametrize("spec", ["train[13:]", "train[:-13]", "train[101%:]", "train[:5%",
                                  "train[1:2:3]", "train[5]", "train[1.5:]", "train[]",
                                  "all[:5]"])
def test_bad_specs_are_refused_like_tfds(spec):
    with pytest.raises(ValueError, match="split"):
        slices.windows(spec, SPLITS.__getitem__)
    if spec != "all[:5]":  # TFDS reads `all` unsliced only
        with pytest.raises(ValueError):
            _tfds_windows(spec, SPLITS)


def test_window_lengths_and_plain_names():
    (w,) = slices.windows("train[25%:75%]", SPLITS.__getitem__)
    assert (w.start, w.stop, len(w)) == (3, 9, 6)
    assert slices.is_plain("train") and not slices.is_plain("train[:5]")
    assert not slices.is_plain("train+test")
