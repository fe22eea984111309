"""The resumed plan, pure (no Beam): a failed run's finished shards taken by their own
listing, whatever else changed; held slots of the cut; new images after it."""

import json

from beam_pipeline.job import attempts
from beam_pipeline.job.contracts import Kind, Origin, ShardFiles, ShardResult, Written
from beam_pipeline.launcher import identity, listing, plan, resume, rules
from beam_pipeline.refs import ImageRef
from dataset_format import layout

SPLITS = rules.parse_splits("train=1.0")
N = 4
CONFIG = plan.FullPlanConfig(num_shards=N, target_shard_mb=1, reframe=False)


def _ref(key, size=1000):
    return ImageRef(key, f"/data/{key}", key.split("/")[0], None, size, "1500:1500")


def _resolved(refs, tmp_path):
    tmp_path.mkdir(parents=True, exist_ok=True)
    listed = listing.plan_listing(iter(refs), listing.Fingerprint({"a": 1}, "0"), None,
                                  str(tmp_path), lambda e: None)
    return identity.resolve(listed.by_key, None, SPLITS, str(tmp_path))


def _killed_run(refs, tmp_path, finished_slots, settings="S"):
    """The failed run's plan of `refs`: the listings of `finished_slots` written as it
    wrote them -> ([attempts.Finished], {slot: [keys]})."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    vdir = str(tmp_path / "versions" / "20260101T000000Z")
    shards = {}
    for planned in plan.full_plan(_resolved(refs, tmp_path), CONFIG, str(tmp_path)).shards:
        shards[planned.shard] = list(planned.lines)
    done = []
    for slot in finished_slots:
        (tmp_path / "listings").mkdir(exist_ok=True)
        path = str(tmp_path / "listings" / f"{slot}.jsonl")
        with open(path, "w") as f:
            f.writelines(line + "\n" for line in shards[slot])
        result = ShardResult("train", slot, origin=Origin.HASH,
                             files=ShardFiles(layout.shard_name("pets", "train", slot, N)),
                             written=Written(len(shards[slot])))
        done.append(attempts.Finished(vdir, f"{vdir}/.tmp/{slot}.fragment", path, settings,
                                      result))
    keys = {s: [json.loads(line)[0] for line in lines] for s, lines in shards.items()}
    return done, keys


def _key_in_slot(slot, taken):
    i = 0
    while True:
        key = f"cat/new{i:04d}.jpg"
        if rules.shard_of("train", key, N) == slot and key not in taken:
            return key
        i += 1


def test_unchanged_shards_are_taken_whatever_else_changed(tmp_path):
    refs = [_ref(f"{'cat' if i % 2 else 'dog'}/{i:03d}.jpg") for i in range(40)]
    finished, keys = _killed_run(refs, tmp_path / "a", [0, 2])
    # Between the runs: one image of finished slot 2 deleted, one added into slot 0's range
    # (a taken slot), one into slot 1's (not finished).
    gone = keys[2][0]
    new0, new1 = _key_in_slot(0, set()), _key_in_slot(1, set())
    now = [r for r in refs if r.key != gone] + [_ref(new0), _ref(new1)]
    resolved = _resolved(now, tmp_path / "b")

    nothing = resume.take(resolved, finished, "other settings", str(tmp_path))
    assert nothing.taken == [] and nothing.remainder is resolved

    resumed = resume.take(resolved, finished, "S", str(tmp_path))
    # slot 0 whole (shared); slot 2 lost an image: the rest of its records copied
    assert [(t.finished.result.shard, t.whole) for t in resumed.taken] == [(0, True),
                                                                           (2, False)]
    rest = resumed.remainder
    assert rest.num_images == 41 - len(keys[0]) - (len(keys[2]) - 1)
    assert sorted(ref.key for ref, _ in rest.refs()) == sorted(
        set(r.key for r in now) - set(keys[0]) - set(keys[2]))
    assert sorted(json.loads(line)[0] for line, _ in rest.ref_lines()) == sorted(
        ref.key for ref, _ in rest.refs())

    held = resumed.held("pets", plan.cut(resolved.per_split, CONFIG))
    assert {s: sorted(v) for s, v in held.items()} == {"train": [0, 2]}
    config = plan.FullPlanConfig(N, 1, False, listed=resolved.per_split,
                                 held={"train": frozenset([0, 2])})
    shard_plan = resume.with_resumed(plan.full_plan(rest, config, str(tmp_path)), resumed, held)
    assert shard_plan.num_shards == {"train": N + 1}
    by_slot, lines = {}, {}
    for p in shard_plan.shards:  # (lines are streamed: read each before the next)
        by_slot[p.shard], lines[p.shard] = p, list(p.lines)
    assert sorted(by_slot) == [0, 1, 2, 3, 4]  # the cut's four slots and one new shard
    for slot in (0, 2):
        assert (by_slot[slot].kind, by_slot[slot].origin) == (Kind.RESUME, Origin.HASH)
        header = json.loads(lines[slot][0])
        assert header["source"] == (f"../20260101T000000Z/"
                                    f"{layout.shard_name('pets', 'train', slot, N)}")
        assert header["listing_file"] == finished[slot // 2].listing
        assert header["whole"] is (slot == 0)
    assert lines[0][1:] == [] and [json.loads(k) for k in lines[2][1:]] == [gone]  # its loss
    lines = {s: [json.loads(line)[0] for line in lines[s]] for s in (1, 3, 4)}
    assert lines[4] == [new0] and by_slot[4].origin == Origin.DELTA  # after the cut
    assert sorted(lines[1]) == sorted(keys[1] + [new1])  # slots keep their hash range
    assert lines[3] == keys[3]
    every = keys[0] + [k for k in keys[2] if k != gone] + [k for s in (1, 3, 4)
                                                           for k in lines[s]]
    assert sorted(every) == sorted(r.key for r in now)  # each image exactly once


def test_a_key_two_finished_shards_list_goes_to_one(tmp_path):
    """Two failed runs finished shards listing the same image (the newer one's plan moved
    it): the newer run's shard is taken, the older one's is not (it would store the image
    twice)."""
    refs = [_ref(f"cat/{i:03d}.jpg") for i in range(12)]
    newer, keys = _killed_run(refs, tmp_path / "new", [1])
    older, _ = _killed_run(refs, tmp_path / "old", [1])
    older = [attempts.Finished(f.vdir.replace("20260101", "20251231"), f.fragment, f.listing,
                               f.settings, f.result) for f in older]
    resolved = _resolved(refs, tmp_path / "b")
    resumed = resume.take(resolved, newer + older, "S", str(tmp_path))
    assert [t.finished.vdir for t in resumed.taken] == [newer[0].vdir]  # (the older one
    assert resumed.remainder.num_images == 12 - len(keys[1])             # kept no key)
