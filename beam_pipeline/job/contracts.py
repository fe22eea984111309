"""What crosses the job's seams: the shard plan and tasks the launcher writes, the result a
writer returns, and the CommitSpec the launcher hands the job.

Both are frozen, so no stage edits another's value: a stage that changes a result (reuse,
dedupe) returns a new one with dataclasses.replace. Results cross processes as JSON (the
coder below), so a field that JSON cannot carry fails in the first test, not on Dataflow.
"""

import dataclasses
import json
from typing import Iterable, Optional

import apache_beam as beam

from beam_pipeline import defaults
from beam_pipeline.kinds import Kind, Origin  # noqa: F401  (the plan's words, re-exported)
from dataset_format import layout
from dataset_format.error_record import ErrorRecord


@dataclasses.dataclass(frozen=True)
class ShardTask:
    """One line of the shard index: a shard to produce and the listing file that says how."""

    split: str
    shard: int
    listing: str
    kind: Kind = Kind.IMAGES
    origin: Origin = Origin.HASH

    def to_json(self):  # a list, the shard index's line format since format version 1
        return json.dumps([self.split, self.shard, self.listing, self.kind, self.origin])

    @classmethod
    def from_json(cls, line):
        split, shard, listing, kind, origin = json.loads(line)
        return cls(split, shard, listing, Kind(kind), Origin(origin))


@dataclasses.dataclass(frozen=True)
class PlannedShard:
    """A shard task as a plan hands it to the shard index (launcher/shard_index.py): the
    ShardTask before its listing file has a path, with the lines that file gets (streamed:
    read from the plan's spills as the file is written)."""

    split: str
    shard: int
    kind: Kind
    origin: Origin
    lines: Iterable = ()

    def task(self, listing):
        """The shard index's line for this shard, its listing written at `listing`."""
        return ShardTask(self.split, self.shard, listing, self.kind, self.origin)


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """What a plan, full (launcher/plan.py) or incremental (launcher/incremental.py), decided:
    the shard count of each split, the shards (streamed once), the images the job decodes
    (the rest are stored records reused or re-framed), and for an incremental plan what it
    builds on (CommitSpec.increment: the counts and "from")."""

    num_shards: dict                  # split -> N
    shards: Iterable[PlannedShard]
    to_convert: int
    increment: Optional[dict] = None


@dataclasses.dataclass(frozen=True)
class Listed:
    """What listing counted before the job: every input once (docs/format.md, accounting)."""

    listed: int = 0
    duplicates: int = 0       # the same file listed twice (by path)
    errors_path: str = ""     # errors found while listing, a JSONL file in the temp dir


@dataclasses.dataclass(frozen=True)
class Dedup:
    """--drop_content_duplicates and --near_duplicates*: what commit groups and drops."""

    drop_content_duplicates: bool = False
    near_duplicates: bool = False          # group the catalog's perceptual hashes
    near_duplicate_radius: int = defaults.NEAR_DUPLICATE_RADIUS  # Hamming bits
    drop_near_duplicate_leaks: bool = False

    @property
    def rewrites(self):
        """Whether commit may rewrite shards (so each attempt writes a temp name)."""
        return self.drop_content_duplicates or self.drop_near_duplicate_leaks


@dataclasses.dataclass(frozen=True)
class Retention:
    """--keep_versions and --keep_superseded_hours: what publishing prunes."""

    keep_versions: int = 0
    keep_superseded_hours: float = defaults.KEEP_SUPERSEDED_HOURS


@dataclasses.dataclass(frozen=True)
class CommitSpec:
    """What the launcher knew: everything the manifest needs besides the ShardResults."""

    root: str
    version: str
    name: str
    labels: tuple
    num_shards: dict          # split -> N
    listed: Listed
    input_fingerprint: str
    config: dict
    generator: dict
    max_error_rate: float
    write_index: bool
    retention: Retention = Retention()
    dedup: Dedup = Dedup()
    increment: dict = None    # incremental: {"from": version, "removed": n, "changed": n, …}
    lock_token: str = None    # the launcher's ROOT/.lock token, checked before publishing
    split_map_from: Optional[str] = None   # the split map this version was planned with
    notes: tuple = ()                      # what the launcher found and said (history.py)
    fields: Optional[dict] = None          # declared fields, vocabularies given (fields.Schema
                                           # .to_json()); None: a build without
    # The build that wrote the previous version's shards (its manifest's build.workers):
    # what a reuse/copy task's records were written with. None: not recorded.
    previous_build: Optional[dict] = None

    @property
    def previous_vdir(self):
        return layout.version_dir(self.root, self.increment["from"]) if self.increment else None

    @property
    def vdir(self):
        return layout.version_dir(self.root, self.version)

    @property
    def tmp_dir(self):  # the build's work files: the listings, shard attempts, listing errors
        return self.tmp_dir_of(self.root, self.version)

    @staticmethod
    def tmp_dir_of(root, version):
        """tmp_dir before the spec exists (the launcher writes the listings there first)."""
        return layout.tmp_dir(layout.version_dir(root, version))


@dataclasses.dataclass(frozen=True)
class PixelMoments:
    """Exact sums over a shard's stored pixels (uint8 values and their squares, in float64:
    integers held exactly), for the transform analysis."""

    count: int = 0
    sum: tuple = (0.0, 0.0, 0.0)
    sum_sq: tuple = (0.0, 0.0, 0.0)

    def plus(self, count, sums, squares):
        """These moments plus one image's (pixel count, (r, g, b) sums, sums of squares)."""
        return PixelMoments(self.count + int(count),
                            tuple(a + float(b) for a, b in zip(self.sum, sums)),
                            tuple(a + float(b) for a, b in zip(self.sum_sq, squares)))


@dataclasses.dataclass(frozen=True)
class ShardFiles:
    """Where a shard and its companions are.

    `temp` is where this attempt wrote the shard: its final place in the version directory
    (job/shards.py writes there directly), or a temp name commit renames to `path`, as
    `index_temp` to its index. Commit merges `catalog_temp` into the catalog.
    """

    path: Optional[str] = None          # the shard's file name in the version directory
    temp: Optional[str] = None          # where this attempt wrote it
    index_temp: Optional[str] = None
    catalog_temp: Optional[str] = None  # this shard's catalog fragment (None: --sink beam)
    # Reused as it is where an earlier version wrote it: the manifest path ../VERSION/NAME
    # (`temp` is then that file). None: the shard is this version's own file, `path`.
    shared: Optional[str] = None

    @property
    def file(self):
        """The shard's path as the manifest and catalog give it (relative to the version
        directory; docs/format.md)."""
        return self.shared or self.path


@dataclasses.dataclass(frozen=True)
class Written:
    """The shard file as the manifest lists it: its records, its size and its checksum."""

    num_examples: int = 0
    num_bytes: int = 0
    # The file's checksum for the manifest: CRC-32C (dataset_format/frames.crc32c_text) for every
    # shard written since format 2 carried it; sha256 (hex) only for a shard reused as is
    # from a version written before.
    crc32c: Optional[str] = None
    sha256: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class Made:
    """How the shard's records came to be (the manifest's accounting and build counts)."""

    passed_through: int = 0             # JPEGs stored as they came
    converted: int = 0                  # images decoded and converted
    reframed: int = 0                   # stored records re-framed under a new key or label
    repaired: int = 0                   # stored records found damaged: converted again
    resumed: bool = False               # taken from a failed run's finished shard (attempts.py)


@dataclasses.dataclass(frozen=True)
class Sums:
    """What commit sums across shards, of variable size (ShardResult.slim drops it)."""

    label_counts: dict = dataclasses.field(default_factory=dict)  # class name -> records
    pixel_moments: Optional[PixelMoments] = None  # --transform shards written from images


@dataclasses.dataclass(frozen=True)
class Writer:
    """Who wrote the shard's records."""

    process: Optional[str] = None       # host:pid of the writing process
    # The code build that wrote the shard's records (job/code_build.py): the writing
    # worker's, or for a reuse/copy task the previous version's. None: not recorded (a
    # fragment of a failed run written before builds were). Commit refuses a version
    # whose shards name two builds.
    build: Optional[dict] = None


@dataclasses.dataclass(frozen=True)
class ShardResult:
    """One shard written (or, split and shard None, errors alone: --sink beam), in parts:
    where its files are, what the file is, how its records were made, the sums commit adds
    up, its rejected inputs, and who wrote it. A stage changes a part with `with_files`,
    `with_written` or `with_made` (or dataclasses.replace of a whole part)."""

    split: Optional[str]
    shard: Optional[int]
    kind: Optional[Kind] = None         # the ShardTask's kind (None: --sink beam)
    origin: Origin = Origin.HASH
    files: ShardFiles = ShardFiles()
    written: Written = Written()
    made: Made = Made()
    sums: Sums = Sums()
    errors: tuple = ()                  # ErrorRecords for errors.jsonl
    writer: Writer = Writer()

    def with_files(self, **changes):
        return dataclasses.replace(self, files=dataclasses.replace(self.files, **changes))

    def with_written(self, **changes):
        return dataclasses.replace(self, written=dataclasses.replace(self.written, **changes))

    def with_made(self, **changes):
        return dataclasses.replace(self, made=dataclasses.replace(self.made, **changes))

    def slim(self):
        """This result without its variable-size parts (label counts, error records, pixel
        moments): what commit's one list of every shard carries. The counts reach commit
        summed across workers and the errors as a file (job/commit.py, Commit)."""
        return dataclasses.replace(self, sums=Sums(), errors=())

    def to_json(self):
        """One flat object, its keys in the order of the flat ShardResult before its parts:
        the record a failed run's fragment keeps (job/attempts.py) reads the same either way."""
        f, w, m, s = self.files, self.written, self.made, self.sums
        moments = s.pixel_moments and dataclasses.asdict(s.pixel_moments)
        return json.dumps({
            "split": self.split, "shard": self.shard, "path": f.path, "temp": f.temp,
            "num_examples": w.num_examples, "num_bytes": w.num_bytes, "crc32c": w.crc32c,
            "sha256": w.sha256, "label_counts": s.label_counts,
            "errors": [e.to_dict() for e in self.errors],
            "passed_through": m.passed_through, "converted": m.converted,
            "reframed": m.reframed, "repaired": m.repaired, "kind": self.kind,
            "origin": self.origin, "writer": self.writer.process,
            "catalog_temp": f.catalog_temp, "index_temp": f.index_temp,
            "pixel_moments": moments, "resumed": m.resumed, "shared": f.shared,
            "build": self.writer.build})

    @classmethod
    def from_json(cls, text):
        o = json.loads(text)
        moments = o["pixel_moments"]
        if moments is not None:
            moments = PixelMoments(moments["count"], tuple(moments["sum"]),
                                   tuple(moments["sum_sq"]))
        return cls(
            o["split"], o["shard"], kind=o["kind"] and Kind(o["kind"]), origin=Origin(o["origin"]),
            files=ShardFiles(o["path"], o["temp"], o["index_temp"], o["catalog_temp"],
                             o["shared"]),
            written=Written(o["num_examples"], o["num_bytes"], o["crc32c"], o["sha256"]),
            made=Made(o["passed_through"], o["converted"], o["reframed"], o["repaired"],
                      o["resumed"]),
            sums=Sums(o["label_counts"], moments),
            errors=tuple(ErrorRecord.from_dict(e) for e in o["errors"]),
            writer=Writer(o["writer"], o["build"]))


class ShardResultCoder(beam.coders.Coder):
    """ShardResults between workers as their JSON."""

    def encode(self, value):
        return value.to_json().encode()

    def decode(self, encoded):
        return ShardResult.from_json(encoded.decode())

    def is_deterministic(self):
        return False


beam.coders.registry.register_coder(ShardResult, ShardResultCoder)
