"""Strict options: unknown flags and config keys, YAML errors, Beam's own
options passing through, and the shipped configs and template parameters still parsing."""

import ast
import json

import pytest

from beam_pipeline import cli
from beam_pipeline.launcher import flags, options
from beam_pipeline.errors import UserError
from dataset_format import layout
from tests.helpers import REPO

IO = ["--input", "gs://bkt/images", "--output", "gs://bkt/ds"]


def error_line(capsys, argv, tmp_path):
    """cli.main(argv) must exit 2 with exactly one 'error: …' line, before any work."""
    out = tmp_path / "out"
    assert cli.main([str(a) for a in argv] + ["--output", str(out)]) == 2
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert not out.exists(), "the output was touched before the options were checked"
    return lines[0]


@pytest.fixture
def images(tmp_path, make_images):
    make_images(tmp_path / "src", {"cat": 1, "dog": 1})
    return tmp_path / "src"


@pytest.mark.parametrize("argv, named, hint", [
    (["--num_shardz", "3"], "--num_shardz", "--num_shards"),
    (["--num_shardz=3"], "--num_shardz", "--num_shards"),
    (["--num-shards", "3"], "--num-shards", "--num_shards"),
    (["--num_shard", "3"], "--num_shard", "--num_shards"),  # no abbreviations
    (["--max_error", "0.5"], "--max_error", "--max_error_rate"),
    (["--conf", "x.yaml"], "--conf", "--config"),
    (["--direct_num_workerz", "2"], "--direct_num_workerz", "--direct_num_workers"),
    (["--runnr", "DirectRunner"], "--runnr", "--runner"),
])
def test_unknown_flag_exits_2_naming_it_and_the_closest_option(capsys, images, tmp_path, argv,
                                                                named, hint):
    line = error_line(capsys, ["--input", images] + argv, tmp_path)
    assert line == f"error: unknown option {named} (did you mean {hint}?)"


def test_unknown_flag_without_a_close_name(capsys, images, tmp_path):
    line = error_line(capsys, ["--input", images, "--zzzzzzzzzz"], tmp_path)
    assert line == "error: unknown option --zzzzzzzzzz"


def test_stray_value_is_an_error(capsys, images, tmp_path):
    # e.g. an unquoted glob the shell expanded: only the first file follows --input
    line = error_line(capsys, ["--input", images / "cat" / "000.jpg",
                               images / "dog" / "000.jpg"], tmp_path)
    assert "unexpected argument" in line and "000.jpg" in line and "quote" in line


def test_unknown_yaml_key(capsys, images, tmp_path):
    config = tmp_path / "x.yaml"
    config.write_text("runner: FnApiRunner\nnum_shardz: 3\n")
    line = error_line(capsys, ["--config", config, "--input", images], tmp_path)
    assert line == f"error: {config}: unknown key 'num_shardz' (did you mean 'num_shards'?)"


@pytest.mark.parametrize("text, line", [
    ("name: a\nsplits: train=1\nnum_shards: [1, 2\n", 4),
    ("name: a\n  num_shards: 2\n", 2),
    ("name: a\nsplits: 'train=1\n", 3),
])
def test_yaml_syntax_error_names_file_and_line(capsys, images, tmp_path, text, line):
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    got = error_line(capsys, ["--config", config, "--input", images], tmp_path)
    assert got.startswith(f"error: {config}:{line}: "), got


def test_bad_value_in_yaml_names_the_file(capsys, images, tmp_path):
    config = tmp_path / "v.yaml"
    config.write_text("num_shards: many\n")
    line = error_line(capsys, ["--config", config, "--input", images], tmp_path)
    assert str(config) in line and "--num_shards" in line and "'many'" in line


def test_config_cannot_name_another_config(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("config: other.yaml\n")
    with pytest.raises(UserError, match="unknown key 'config'"):
        options.parse(["--config", str(config)] + IO)


@pytest.mark.parametrize("argv", [["--direct_num_workers", "3"], ["--direct_num_workers=3"]])
def test_known_beam_option_passes_through(argv):
    pipeline_options, build = options.parse(IO + ["--num_shards", "2"] + argv)
    assert pipeline_options.get_all_options()["direct_num_workers"] == 3
    assert build.num_shards == 2
    assert "direct_num_workers" not in build.build_config()  # a Beam option, not a build one


def test_beam_options_are_checked_with_beams_own_parser():
    """Every flag some registered PipelineOptions class declares is accepted, nothing else."""
    from apache_beam.options.pipeline_options import GoogleCloudOptions

    names = {s for a in options.known_options_parser()._actions for s in a.option_strings}
    assert {"--runner", "--project", "--flink_master", "--experiments", "--num_shards",
            "--config"} <= names
    pipeline_options, _ = options.parse(IO + ["--project", "p", "--labels", "team=ml",
                                              "--experiments=a", "--experiments", "b"])
    assert pipeline_options.view_as(GoogleCloudOptions).project == "p"
    assert pipeline_options.get_all_options()["experiments"] == ["a", "b"]


def test_bad_value_on_the_command_line_exits_2_in_one_line(capsys):
    with pytest.raises(SystemExit) as info:
        options.parse(IO + ["--direct_num_workers", "two"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: argument --direct_num_workers: invalid int value: 'two'"


def test_shipped_local_config_parses():
    pipeline_options, build = options.parse(
        ["--config", str(REPO / "configs" / "local.yaml")] + IO)
    all_options = pipeline_options.get_all_options()
    assert all_options["runner"] == "FnApiRunner"
    assert all_options["direct_running_mode"] == "multi_threading"
    assert all_options["direct_num_workers"] == 0
    assert build.splits == "train=0.8,validation=0.1,test=0.1"


def test_shipped_dataflow_config_parses():
    pipeline_options, build = options.parse(
        ["--config", str(REPO / "configs" / "dataflow.yaml"), "--project", "p",
         "--temp_location", "gs://bkt/tmp"] + IO)
    all_options = pipeline_options.get_all_options()
    assert all_options["runner"] == "DataflowRunner"
    assert all_options["machine_type"] == "n2-standard-4"
    assert all_options["experiments"] == ["use_runner_v2"]
    # Workers get the code from the worker image, whose tag is per project (command line);
    # the config must not ship an sdist that workers would pip-install from PyPI.
    assert all_options.get("setup_file") is None and all_options.get("sdk_container_image") is None
    assert all_options["region"] == "us-central1"
    assert build.target_shard_mb == 128


def test_flex_template_and_airflow_parameters_parse():
    """What the Flex Template launcher runs: configs/flex_template/main.py adds --runner, the
    DAG's parameters arrive as --name=value, and the launcher adds its own Beam options."""
    tree = ast.parse((REPO / "configs" / "airflow" / "image_tfrecords_dag.py").read_text())
    params = next(ast.literal_eval(node.value) for node in tree.body
                  if isinstance(node, ast.Assign)
                  and getattr(node.targets[0], "id", None) == "TEMPLATE_PARAMETERS")
    params.update(input="gs://bkt/images", output="gs://bkt/ds")
    launcher = ["--project=p", "--region=us-central1", "--temp_location=gs://bkt/tmp",
                "--staging_location=gs://bkt/staging", "--template_location=gs://bkt/t.json",
                "--setup_file=/template/setup.py", "--sdk_container_image=image",
                "--max_num_workers=16", "--machine_type=n2-standard-4",
                "--labels=dataset=image-tfrecords", "--job_name=image-tfrecords-20260101"]
    argv = ["--runner=DataflowRunner"] + [f"--{k}={v}" for k, v in params.items() if v != ""]
    pipeline_options, build = options.parse(argv + launcher)
    assert build.keep_versions == int(params["keep_versions"])
    assert pipeline_options.get_all_options()["template_location"] == "gs://bkt/t.json"
    metadata = json.loads((REPO / "configs" / "flex_template" / "metadata.json").read_text())
    argv = ["--runner=DataflowRunner"] + [f"--{p['name']}={p['defaultValue']}"
                                          for p in metadata["parameters"] if "defaultValue" in p]
    options.parse(argv + IO + launcher)


@pytest.mark.slow
def test_config_with_beam_keys_still_builds(images, tmp_path):
    """A config mixing Beam keys (runner, store_true flags set false) and build keys."""
    config = tmp_path / "c.yaml"
    config.write_text("runner: FnApiRunner\nsave_main_session: false\nnum_shards: 1\n")
    result = cli.run(["--config", str(config), "--input", str(images),
                      "--output", str(tmp_path / "out")])
    assert result.status == "published"
    assert (tmp_path / "out" / layout.LATEST).exists()


@pytest.mark.parametrize("argv, verbose", [
    ([], False), (["--verbose"], True), (["--verbose=true"], True), (["--verbose", "true"], True),
    (["--verbose", "false"], False), (["--verbose=0"], False), (["--verbose", "--force"], True),
    (["--verbose", "--verbose=false"], False),
])
def test_wants_verbose(argv, verbose):
    assert flags.wants_verbose(argv) is verbose
