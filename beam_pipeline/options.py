"""The one options object: every build knob, shared by flags, YAML configs and templates."""

import argparse

import yaml
from apache_beam.options.pipeline_options import PipelineOptions

from beam_pipeline.errors import UserError
from beam_pipeline.flags import add_build_args, boolean  # noqa: F401 — boolean is public here


class BuildOptions(PipelineOptions):
    """Build options; anything not listed here is a Beam pipeline option."""

    @classmethod
    def _add_argparse_args(cls, parser):
        add_build_args(parser)

    def validate_build(self):
        """Check values where they are set, naming the bad one."""
        from beam_pipeline import plan

        if not self.input:
            raise UserError("--input is required (a directory, glob or .csv/.jsonl manifest)")
        if not self.output:
            raise UserError("--output is required (a local directory or gs://bucket/prefix)")
        if not self.name or not all(c.isalnum() or c in "_." for c in self.name):
            raise UserError(f"--name {self.name!r}: use letters, digits, '_' or '.' "
                            "('-' separates the name from the split in file names)")
        checks = [
            (self.num_shards >= 0, f"--num_shards {self.num_shards}: must be >= 0"),
            (self.target_shard_mb > 0, f"--target_shard_mb {self.target_shard_mb}: must be > 0"),
            (0 <= self.max_error_rate <= 1,
             f"--max_error_rate {self.max_error_rate}: must be between 0 and 1"),
            (self.keep_versions >= 0, f"--keep_versions {self.keep_versions}: must be >= 0"),
            (self.max_pixels > 0, f"--max_pixels {self.max_pixels}: must be > 0"),
            (self.transform_image_size > 0,
             f"--transform_image_size {self.transform_image_size}: must be > 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise UserError(message)
        try:
            plan.parse_splits(self.splits)
            self.encode_options()
        except ValueError as e:
            raise UserError(str(e)) from e

    def encode_options(self):
        from beam_pipeline.images import EncodeOptions

        return EncodeOptions(max_side=self.max_side, reencode=self.reencode, validate=self.validate,
                             jpeg_quality=self.jpeg_quality, max_pixels=self.max_pixels)

    def build_config(self):
        """The effective build options (recorded in the manifest and the fingerprint)."""
        own = {a.dest for a in _own_actions()}
        return {k: v for k, v in sorted(self.get_all_options().items()) if k in own}


# Options that change where or whether a build happens, not what it produces.
NOT_FINGERPRINTED = {"input", "output", "force", "keep_versions", "verbose", "wait"}


def _own_actions():
    parser = argparse.ArgumentParser()
    add_build_args(parser)
    return [a for a in parser._actions if a.dest != "help"]


def config_to_argv(path):
    """A YAML config -> flags, placed before the command line's so flags override it."""
    try:
        with open(path) as f:
            config = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as e:
        raise UserError(f"--config {path}: cannot read it ({e})") from e
    if not isinstance(config, dict):
        raise UserError(f"--config {path}: expected a mapping of option: value")
    argv = []
    for key, value in config.items():
        values = value if isinstance(value, list) else [value]
        for v in values:
            if v is True:
                argv.append(f"--{key}")
            elif v is False:
                argv.append(f"--{key}=false")
            elif v is not None:
                argv.append(f"--{key}={v}")
    return argv


def parse(argv):
    """argv (with optional --config FILE) -> (PipelineOptions, BuildOptions view)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known, rest = pre.parse_known_args(argv)
    if "-h" in rest or "--help" in rest:  # Beam's base PipelineOptions would print an empty help
        from beam_pipeline.flags import help_parser

        help_parser().print_help()
        raise SystemExit(0)
    config_argv = config_to_argv(known.config) if known.config else []
    if any(a == "--input" or a.startswith("--input=") for a in rest):
        config_argv = [a for a in config_argv if not a.startswith("--input=")]
    # A YAML 'false' for a Beam store_true flag just means "leave it off".
    own = {f"--{a.dest}" for a in _own_actions()}
    config_argv = [a for a in config_argv
                   if not a.endswith("=false") or a.split("=", 1)[0] in own]
    options = PipelineOptions(config_argv + rest)
    build = options.view_as(BuildOptions)
    build.validate_build()
    return options, build
