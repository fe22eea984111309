"""Scheduling artifacts: the Flex Template metadata, its launcher entry point, the
Airflow DAG and the crontab line name the CLI's real build options with the right types."""

import ast
import json
import re
import runpy
import sys

import pytest

from beam_pipeline.launcher import options
from tests.helpers import REPO

METADATA = REPO / "configs" / "flex_template" / "metadata.json"
DAG = REPO / "configs" / "airflow" / "image_tfrecords_dag.py"
MAIN = REPO / "configs" / "flex_template" / "main.py"
DOCKERFILE = REPO / "configs" / "flex_template" / "Dockerfile"
DATAFLOW_YAML = REPO / "configs" / "dataflow.yaml"
CRONTAB = REPO / "configs" / "crontab.example"
DOCS = REPO / "docs" / "scheduling.md"


def metadata():
    return json.loads(METADATA.read_text())


def parameters():
    return {p["name"]: p for p in metadata()["parameters"]}


def actions():
    """--flag -> the argparse action of every build option (BuildOptions, not Beam's)."""
    return {s: a for a in options._own_actions() for s in a.option_strings}


def kind(action):
    """What a template parameter of this option must look like."""
    if action.choices:
        return "ENUM"
    if action.type is options.boolean:
        return "BOOLEAN"
    if action.type in (int, float):
        return "NUMBER"
    assert action.type is None, f"{action.dest}: no mapping for type {action.type}"
    return "TEXT"


def test_metadata_is_a_valid_dataflow_template_spec():
    from google.cloud.dataflow_v1beta3 import types

    spec = types.TemplateMetadata.from_json(METADATA.read_text())  # unknown fields raise
    assert spec.name and spec.description and not spec.streaming
    names = [p.name for p in spec.parameters]
    assert len(names) == len(set(names))
    for p in spec.parameters:
        assert p.label and len(p.help_text) >= 20, p.name


def test_every_parameter_is_a_build_option_with_the_same_type():
    acts = actions()
    for name, p in parameters().items():
        flag = f"--{name}"
        assert flag in acts, f"{name} in metadata.json is not an option of the CLI"
        action = acts[flag]
        assert action.dest == name
        expected = kind(action)
        param_type = p.get("paramType", "TEXT")
        if expected == "TEXT":
            assert param_type in ("TEXT", "GCS_READ_FILE", "GCS_READ_FOLDER",
                                  "GCS_WRITE_FOLDER"), name
        else:
            assert param_type == expected, f"{name}: {param_type}, CLI type is {expected}"
        if expected == "ENUM":
            assert [o["value"] for o in p["enumOptions"]] == list(action.choices), name
        assert p.get("isOptional", False) == (name not in ("input", "output")), name


def test_every_build_option_is_a_template_parameter():
    """Template users can set every knob; add new options to metadata.json and the DAG."""
    names = set(parameters())
    missing = {a.dest for a in options._own_actions()} - names
    assert not missing, f"build options missing from {METADATA.name}: {sorted(missing)}"


def test_regexes_accept_the_defaults_and_good_values_and_reject_bad_ones():
    good = {"input": ["gs://bkt/images", "gs://bkt/list.csv", "gs://bkt/img/**/*.jpg"],
            "output": ["gs://bkt/datasets/flowers"], "label_file": ["gs://bkt/labels.txt"],
            "name": ["flowers", "my_set.v2"], "splits": ["train=0.9,validation=0.1", "train=1"],
            "num_shards": ["16"], "target_shard_mb": ["64", "12.5"], "max_error_rate": ["0.05",
            "1", "0"], "jpeg_quality": ["1", "95", "100"], "keep_versions": ["7"],
            "force": ["true", "false"], "reencode": ["always"], "sink": ["beam"]}
    bad = {"input": ["/local/dir", "s3://bkt/x", ""], "output": ["out", "gs://"],
           "label_file": ["labels.txt"], "name": ["my-set", ""], "splits": ["train", "80%"],
           "num_shards": ["-1", "two"], "target_shard_mb": ["x"], "max_error_rate": ["2", "-0.1"],
           "jpeg_quality": ["0", "101"], "keep_versions": ["1.5"], "force": ["maybe"],
           "write_index": ["yes please"], "reencode": ["never"], "sink": ["files"]}
    params = parameters()
    for name, p in params.items():
        assert p.get("regexes"), f"{name}: give it a regex, so a typo fails at launch"
        regexes = [re.compile(r) for r in p["regexes"]]
        matches = lambda v: all(r.search(v) for r in regexes)  # noqa: E731
        values = good.get(name, []) + ([p["defaultValue"]] if "defaultValue" in p else [])
        for value in values:
            assert matches(value), f"{name}: its regex rejects {value!r}"
        for value in bad.get(name, []):
            assert not matches(value), f"{name}: its regex accepts {value!r}"


def test_template_values_parse_like_flags_and_defaults_match_the_cli():
    """The launcher passes --name=value strings: they must parse to the CLI's own defaults."""
    params = parameters()
    defaults = {a.dest: a.default for a in options._own_actions()}
    argv = ["--input=gs://bkt/images", "--output=gs://bkt/ds"]
    argv += [f"--{n}={p['defaultValue']}" for n, p in params.items() if "defaultValue" in p]
    _, build = options.parse(argv)
    config = build.build_config()
    for name, p in params.items():
        if "defaultValue" in p:
            assert config[name] == defaults[name], f"{name}: template default differs"
    # Booleans arrive as strings and go through options.boolean.
    _, build = options.parse(argv + ["--force=true", "--transform=false", "--write_index=false"])
    assert (build.force, build.transform, build.write_index) == (True, False, False)


def dag_literals():
    """Module-level literal assignments of the DAG file, read without importing Airflow."""
    tree = ast.parse(DAG.read_text(), filename=str(DAG))
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            try:
                found[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return tree, found


def test_dag_names_the_template_parameters_and_a_valid_launch_body():
    from google.cloud.dataflow_v1beta3 import types

    tree, literals = dag_literals()
    params = literals["TEMPLATE_PARAMETERS"]
    assert set(params) == set(parameters()), "DAG parameters differ from metadata.json"
    assert all(isinstance(v, str) for v in params.values())
    for name, value in params.items():  # fixed values must pass the template's own regexes
        if value and "{{" not in value:
            for regex in parameters()[name]["regexes"]:
                assert re.search(regex, value), f"DAG {name}={value!r} fails {regex}"
    assert params["force"] == "false", "a nightly run must be a no-op when nothing changed"
    types.FlexTemplateRuntimeEnvironment.from_json(json.dumps(literals["ENVIRONMENT"]))

    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and getattr(n.func, "id", None) == "LaunchImageTfrecords"]
    assert len(calls) == 1
    (subclass,) = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
                   and n.name == "LaunchImageTfrecords"]
    assert [b.id for b in subclass.bases] == ["DataflowStartFlexTemplateOperator"]
    keywords = {k.arg for k in calls[0].keywords}
    assert {"task_id", "project_id", "location", "body", "execution_timeout"} <= keywords
    timeout = next(k.value for k in calls[0].keywords if k.arg == "execution_timeout")
    assert getattr(timeout, "id", None) == "EXECUTION_TIMEOUT"  # max_hours + 1 h (the source)
    assert float(params["max_hours"]) > 0, "a nightly run needs a bound"
    assert 'hours=float(TEMPLATE_PARAMETERS["max_hours"]) + 1' in DAG.read_text()
    imports = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
               for a in n.names if n.module == "airflow.providers.google.cloud.operators.dataflow"}
    assert "DataflowStartFlexTemplateOperator" in imports


def test_dag_imports_with_airflow_when_installed():
    pytest.importorskip("airflow.providers.google.cloud.operators.dataflow")
    import importlib.util

    spec = importlib.util.spec_from_file_location("image_tfrecords_dag", DAG)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    task = module.dag.get_task("launch_image_tfrecords")
    launch = task.body["launchParameter"]
    assert set(launch["parameters"]) == set(parameters()) - {"label_file", "schema"}


def test_launcher_entry_point_defaults_to_dataflow_and_runs_the_cli(monkeypatch):
    from beam_pipeline import cli

    calls = []
    monkeypatch.setattr(cli, "main", lambda argv=None: calls.append(argv) or 0)
    monkeypatch.delenv("IMAGE_TFRECORDS_WORKER_IMAGE", raising=False)
    for given, expected in (
            (["--input=gs://b/i", "--output=gs://b/o"],
             ["--runner=DataflowRunner", f"--config={DATAFLOW_YAML}", "--input=gs://b/i",
              "--output=gs://b/o"]),
            (["--runner=DirectRunner", "--config=x.yaml", "--input=x"],
             ["--runner=DirectRunner", "--config=x.yaml", "--input=x"])):
        monkeypatch.setattr(sys, "argv", [str(MAIN)] + given)
        with pytest.raises(SystemExit) as exit_:
            runpy.run_path(str(MAIN), run_name="__main__")
        assert exit_.value.code == 0 and calls[-1] == expected


def test_launcher_passes_the_worker_image_it_was_built_with():
    """The launcher image names the worker image (Dockerfile WORKER_IMAGE); main.py passes it
    unless the launch names an image or ships an sdist (the sdist-workers target)."""
    launcher_argv = runpy.run_path(str(MAIN))["launcher_argv"]
    env = {"IMAGE_TFRECORDS_WORKER_IMAGE": "reg/worker:1"}
    assert launcher_argv(["--input=x"], env, configs=()) == [
        "--runner=DataflowRunner", "--input=x", "--sdk_container_image=reg/worker:1"]
    for own in ("--sdk_container_image=reg/other:2", "--setup_file=/template/setup.py"):
        assert launcher_argv([own], env, configs=()) == ["--runner=DataflowRunner", own]
    assert launcher_argv(["--input=x"], {}, configs=()) == ["--runner=DataflowRunner", "--input=x"]


def test_the_flex_launcher_takes_production_settings_from_configs_dataflow_yaml():
    """One place for them: the image copies configs/dataflow.yaml beside main.py, which
    loads it under the launch's own options; it bounds the run and starts workers at once."""
    import yaml

    launcher_argv = runpy.run_path(str(MAIN))["launcher_argv"]
    beside = "/template/dataflow.yaml"
    assert launcher_argv(["--input=x"], {}, configs=(beside, str(DATAFLOW_YAML))) == [
        "--runner=DataflowRunner", f"--config={DATAFLOW_YAML}", "--input=x"]
    assert "COPY configs/dataflow.yaml ${WORKDIR}/dataflow.yaml" in DOCKERFILE.read_text()
    settings = yaml.safe_load(DATAFLOW_YAML.read_text())
    assert settings["num_workers"] >= 1 and settings["max_hours"] > 0
    assert settings["num_workers"] <= settings["max_num_workers"]


def test_launcher_dockerfile_sets_no_setup_file_for_worker_image_launches():
    """The default target installs no sdist on workers: FLEX_TEMPLATE_PYTHON_SETUP_FILE only
    in the sdist-workers stage; the worker image is baked in from WORKER_IMAGE."""
    docker = DOCKERFILE.read_text()
    stages = re.split(r"^FROM ", docker, flags=re.M)[1:]
    names = [stage.split("\n", 1)[0].split()[-1] for stage in stages]
    assert names == ["launcher", "sdist-workers", "worker-image"]
    assert stages[0].startswith("gcr.io/dataflow-templates-base/python311-template-launcher-base")
    setup = [n for n, stage in zip(names, stages) if "FLEX_TEMPLATE_PYTHON_SETUP_FILE" in stage]
    assert setup == ["sdist-workers"]
    for needed in ("FLEX_TEMPLATE_PYTHON_PY_FILE", "IMAGE_TFRECORDS_WORKER_IMAGE=\"${WORKER_IMAGE}\"",
                   "-c constraints.txt", "configs/flex_template/main.py"):
        assert needed in stages[0], needed
    copied = [src for line in re.findall(r"^COPY (.+)$", docker, re.M)
              for src in line.split()[:-1]]
    assert copied and all((REPO / path).exists() for path in copied), copied


def test_crontab_line_runs_run_local_sh_with_real_options():
    lines = [l for l in CRONTAB.read_text().splitlines() if l.strip() and not l.startswith("#")]
    assert len(lines) == 1
    fields = lines[0].split()
    assert len(fields) > 6 and all(re.fullmatch(r"[0-9*/,-]+", f) for f in fields[:5])
    command = lines[0]
    assert "run_local.sh" in command
    flags = {m.group(1) for m in re.finditer(r"\s--([a-z_]+)", command)}
    assert {"input", "output"} <= flags and flags <= {a.dest for a in options._own_actions()}


def test_docs_launch_body_uses_template_parameters():
    text = DOCS.read_text()
    assert "gcloud dataflow flex-template build" in text
    assert "gcloud scheduler jobs create http" in text and "flexTemplates:launch" in text
    bodies = [json.loads(b) for b in re.findall(r"```json\n(.*?)```", text, re.S)]
    launches = [b["launchParameter"] for b in bodies if "launchParameter" in b]
    assert launches, "docs/scheduling.md: no launch request body"
    for launch in launches:
        assert {"input", "output"} <= set(launch["parameters"]) <= set(parameters())
        assert all(isinstance(v, str) for v in launch["parameters"].values())


def test_the_dag_retries_only_failures_a_retry_may_fix():
    """The CLI's exit 3 (a retry repeats it) and the DAG's no-retry markers are one list: a
    job failed for good is named by the exception the CLI maps to 3."""
    from beam_pipeline import cli
    from beam_pipeline.errors import RetryWontHelp
    from beam_pipeline.job import commit

    _, literals = dag_literals()
    assert literals["NO_RETRY"] == cli.NO_RETRY_NAMES == ("ErrorRateExceeded",)
    assert issubclass(commit.ErrorRateExceeded, RetryWontHelp)
    source = DAG.read_text()
    assert "raise AirflowFailException(" in source  # Airflow's "fail, do not retry"
    assert '"retries": 1' in source
