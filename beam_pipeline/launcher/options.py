"""The one options object: every build knob, shared by flags, YAML configs and templates."""

import argparse
import re
import sys

import yaml
from apache_beam.options.pipeline_options import PipelineOptions

from beam_pipeline.errors import UserError
from beam_pipeline.job.images import EncodeOptions
from beam_pipeline.launcher import rules
from beam_pipeline.launcher.flags import add_build_args, boolean  # noqa: F401 — boolean is public here
from beam_pipeline.launcher.flags import help_parser
from dataset_format import fields


class BuildOptions(PipelineOptions):
    """Build options; anything not listed here is a Beam pipeline option."""

    @classmethod
    def _add_argparse_args(cls, parser):
        add_build_args(parser)

    def validate_build(self):
        """Check values where they are set, naming the bad one."""
        if not self.input:
            raise UserError("--input is required (a directory, glob or .csv/.jsonl manifest)")
        if not self.output:
            raise UserError("--output is required (a local directory or gs://bucket/prefix)")
        check_location("--output", self.output)
        for spec in self.input:
            check_location("--input", spec)
        if not self.name or not all(c.isalnum() or c in "_." for c in self.name):
            raise UserError(f"--name {self.name!r}: use letters, digits, '_' or '.' "
                            "('-' separates the name from the split in file names)")
        checks = [
            (self.num_shards >= 0, f"--num_shards {self.num_shards}: must be >= 0"),
            (self.target_shard_mb > 0, f"--target_shard_mb {self.target_shard_mb}: must be > 0"),
            (0 <= self.max_error_rate <= 1,
             f"--max_error_rate {self.max_error_rate}: must be between 0 and 1"),
            (self.keep_versions >= 0, f"--keep_versions {self.keep_versions}: must be >= 0"),
            (self.max_hours >= 0, f"--max_hours {self.max_hours}: must be >= 0"),
            (self.keep_superseded_hours >= 0,
             f"--keep_superseded_hours {self.keep_superseded_hours}: must be >= 0"),
            (0 <= self.max_delta_share <= 1,
             f"--max_delta_share {self.max_delta_share}: must be between 0 and 1"),
            (self.max_pixels > 0, f"--max_pixels {self.max_pixels}: must be > 0"),
            (self.max_image_mb > 0, f"--max_image_mb {self.max_image_mb}: must be > 0"),
            (self.transform_image_size > 0,
             f"--transform_image_size {self.transform_image_size}: must be > 0"),
            (0 <= self.near_duplicate_radius <= 32,
             f"--near_duplicate_radius {self.near_duplicate_radius}: must be in 0..32"),
            (self.near_duplicates or not self.drop_near_duplicate_leaks,
             "--drop_near_duplicate_leaks needs --near_duplicates (the hashes it compares)"),
            (not self.schema or self.sink == "shards",
             "--schema needs --sink shards (the beam sink writes the image's features only)"),
        ]
        for ok, message in checks:
            if not ok:
                raise UserError(message)
        try:
            rules.parse_splits(self.splits)
            self.encode_options()
            self.field_schema()
        except ValueError as e:
            raise UserError(str(e)) from e

    def field_schema(self):
        """--schema FILE -> its fields.Schema (ValueError naming the file); "infer": None,
        the launcher infers it from the manifests; no --schema: an empty Schema."""
        if self.schema == "infer":
            return None
        return fields.load(self.schema) if self.schema else fields.Schema()

    def encode_options(self):
        return EncodeOptions(max_side=self.max_side, reencode=self.reencode, validate=self.validate,
                             jpeg_quality=self.jpeg_quality, max_pixels=self.max_pixels,
                             max_bytes=int(self.max_image_mb * 2**20))

    def build_config(self):
        """The effective build options (recorded in the manifest and the fingerprint)."""
        own = {a.dest for a in _own_actions()}
        return {k: v for k, v in sorted(self.get_all_options().items())
                if k in own and (k not in UNSET_UNRECORDED or v is not None)}


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")  # what a uri starts with, as in RFC 3986
_GCS = re.compile(r"gs://[^/\s]+(/|$)")  # a bucket, then the path


def check_location(flag, location):
    """A local path or gs://bucket/...; anything else that starts like a uri (s3://,
    file:///, a mistyped gs:/bucket or GS://bucket) exits 2 here: it would otherwise be read
    as a local folder named 'gs:' and built there."""
    if _GCS.match(location) or not _SCHEME.match(location):
        return
    if location.lower().startswith("gs:"):
        raise UserError(f"{flag} {location}: not a gs:// location; write gs://BUCKET/PATH")
    raise UserError(f"{flag} {location}: only local paths and gs:// are supported (the tested "
                    "ones); use a gs:// bucket, or a local or mounted path (./NAME for a local "
                    "folder whose name has a colon)")


# What an option changes, for reusing the previous version's records (policy.can_reuse,
# policy.can_increment; README, "Incremental builds"). Every other option changes neither:
# --max_error_rate, --keep_versions, --splits (new content only), --name, ... reuse all.
RECORD_OPTIONS = frozenset({  # the stored records (bytes, which inputs pass, catalog hashes):
    "max_side", "reencode", "jpeg_quality", "validate", "max_pixels",  # a change converts
    "near_duplicates"})                                                # every image again
LAYOUT_OPTIONS = frozenset({  # how records are cut into shards: a change builds in full from
    "num_shards", "target_shard_mb", "write_index"})  # the stored records, decoding none


def changed(previous_config, config, names):
    """The options among `names` whose values differ between two build configs."""
    return sorted(n for n in names if previous_config.get(n) != config.get(n))


# Options recorded only when set: a dataset built without them has the manifest it had
# before they existed.
UNSET_UNRECORDED = frozenset({"schema"})

# Options that change where or whether a build happens, not what it produces.
NOT_FINGERPRINTED = {"input", "output", "force", "keep_versions", "keep_superseded_hours",
                     "verbose", "wait", "max_hours",
                     "full_rebuild", "max_delta_share", "resplit", "verify_inputs"}


def _own_actions():
    parser = argparse.ArgumentParser()
    add_build_args(parser)
    return [a for a in parser._actions if a.dest != "help"]


def config_to_argv(path, known=None):
    """A YAML config -> flags, placed before the command line's so flags override it.

    `known`: the option names (no dashes) a key may have; an unknown key is a UserError naming
    the file, the key and the closest valid name.
    """
    try:
        with open(path) as f:
            config = yaml.safe_load(f) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(e, "problem", None) or " ".join(str(e).split())
        raise UserError(f"{where}: {problem} (YAML syntax)") from e
    except OSError as e:
        raise UserError(f"--config {path}: cannot read it ({e})") from e
    if not isinstance(config, dict):
        raise UserError(f"--config {path}: expected a mapping of option: value")
    argv = []
    for key, value in config.items():
        if known is not None and key not in known:
            hint = _did_you_mean(str(key), known)
            raise UserError(f"{path}: unknown key {str(key)!r}"
                            + (f" (did you mean {hint!r}?)" if hint else ""))
        values = value if isinstance(value, list) else [value]
        for v in values:
            if v is True:
                argv.append(f"--{key}")
            elif v is False:
                argv.append(f"--{key}=false")
            elif v is not None:
                argv.append(f"--{key}={v}")
    return argv


def _did_you_mean(name, names):
    import difflib

    close = difflib.get_close_matches(name, sorted(names), n=1)
    return close[0] if close else None


class _ArgumentError(Exception):
    """A known option with a bad value (argparse's message)."""


def known_options_parser():
    """One parser for every option Beam knows, ours included, built the way Beam's own
    PipelineOptions.get_all_options does (every registered PipelineOptions subclass adds its
    flags; no abbreviations), so a flag passes only when some options class declares it."""
    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

    class Parser(_BeamArgumentParser):
        def error(self, message):
            raise _ArgumentError(message)

    parser = Parser(allow_abbrev=False, add_help=False, conflict_handler="resolve")
    classes, todo = {}, list(PipelineOptions.__subclasses__())
    while todo:  # subclasses of subclasses too, when they declare flags of their own
        cls = todo.pop(0)
        todo.extend(cls.__subclasses__())
        if "_add_argparse_args" in vars(cls):
            classes.setdefault(str(cls), cls)
    for cls in classes.values():
        cls._add_argparse_args(parser)
    parser.add_argument("--config", help="YAML file of option: value defaults")  # see parse()
    return parser


def _option_names(parser):
    return {s for a in parser._actions for s in a.option_strings}


def _import_runner_module(argv, parser):
    """Import --runner's module, as Beam does when it creates the runner: runners outside
    pipeline_options.py (DaskRunner, third-party ones) register their options classes there."""
    import importlib

    from apache_beam.runners import runner as beam_runner

    try:
        name = parser.parse_known_args(argv)[0].runner
    except _ArgumentError:
        return False
    if not isinstance(name, str):
        return False
    runners = getattr(beam_runner, "_RUNNER_MAP", {})
    path = runners.get(name.lower(), runners.get(name.lower() + "runner", name))
    module = path.rsplit(".", 1)[0] if "." in path else None
    if not module or module in sys.modules:
        return False
    try:
        importlib.import_module(module)
    except Exception:  # Beam reports a runner it cannot load when it creates it
        return False
    return True


def check_args(argv, parser, where=None):
    """Every flag in argv must be a known option with a valid value; `where` names a config
    file the flags came from. Unknown names and stray values raise UserError."""
    try:
        _, unknown = parser.parse_known_args(argv)
    except _ArgumentError as e:
        if where:
            raise UserError(f"{where}: {e}") from e
        # argparse's convention for a bad value on the command line: exit status 2, one line.
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from e
    if not unknown:
        return
    first = unknown[0]
    if first.startswith("-") and first != "--":
        name = first.split("=", 1)[0]
        hint = _did_you_mean(name, _option_names(parser))
        raise UserError(f"unknown option {name}" + (f" (did you mean {hint}?)" if hint else ""))
    raise UserError(f"unexpected argument {first!r}: every value needs its --option (quote "
                    "globs so the shell does not expand them)")


def parse(argv):
    """argv (with optional --config FILE) -> (PipelineOptions, BuildOptions view).

    Strict: an unknown flag or config key, or a bad value, stops here (UserError; a bad value
    on the command line exits 2 as argparse does) before any work. Beam's own pipeline options
    pass through.
    """
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config")
    known, rest = pre.parse_known_args(argv)
    if "-h" in rest or "--help" in rest:  # Beam's base PipelineOptions would print an empty help

        help_parser().print_help()
        raise SystemExit(0)
    parser = known_options_parser()
    config_argv = config_to_argv(known.config, _yaml_keys(parser)) if known.config else []
    if _import_runner_module(config_argv + rest, parser):
        parser = known_options_parser()  # with the runner's own options classes
    # A YAML 'false' for a Beam store_true flag just means "leave it off".
    own = {f"--{a.dest}" for a in _own_actions()}
    config_argv = [a for a in config_argv
                   if not a.endswith("=false") or a.split("=", 1)[0] in own]
    check_args(rest, parser)
    check_args(config_argv, parser, where=known.config)
    if any(a == "--input" or a.startswith("--input=") for a in rest):
        config_argv = [a for a in config_argv if not a.startswith("--input=")]
    options = PipelineOptions(config_argv + rest)
    build = options.view_as(BuildOptions)
    build.validate_build()
    return options, build


def _yaml_keys(parser):
    return {s[2:] for s in _option_names(parser) if s.startswith("--")} - {"config"}
