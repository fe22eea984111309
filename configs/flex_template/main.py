"""Flex Template entry point: the launcher runs this file with the template parameters.

The Dataflow launcher calls `python main.py --input=… --output=… [other parameters]` plus
its own pipeline options (--project, --region, --temp_location, --staging_location,
--template_location, and --setup_file when the image sets FLEX_TEMPLATE_PYTHON_SETUP_FILE).
This is the ordinary CLI: cheap checks, listing and the unchanged-inputs fingerprint here,
then the job file the launcher submits, whose last stage commits and publishes. An
unchanged dataset gets a no-op job file, so that launch succeeds too (exit 0 either way).

Production settings live in one place, configs/dataflow.yaml (the image holds it beside
this file): workers, disk, autoscaling, experiments, --max_hours. A template parameter or a
launch option names a value again only to override it.

Workers need the package: the worker image named by --sdk_container_image (default: the
image the launcher was built with, IMAGE_TFRECORDS_WORKER_IMAGE), or a --setup_file sdist.
"""

import os
import sys

from beam_pipeline.cli import console


def given(argv, flag):
    return any(a == flag or a.startswith(flag + "=") for a in argv)


HERE = os.path.dirname(os.path.abspath(__file__))
# In the launcher image dataflow.yaml sits beside this file; in the repository, one up.
CONFIGS = (os.path.join(HERE, "dataflow.yaml"), os.path.join(HERE, "..", "dataflow.yaml"))


def launcher_argv(argv, environ, configs=CONFIGS):
    """The CLI's argv: configs/dataflow.yaml's settings under the launch's own, always
    Dataflow, and the worker image unless the launch names one."""
    argv = list(argv)
    config = next((c for c in configs if os.path.exists(c)), None)
    if config and not given(argv, "--config"):
        argv = [f"--config={os.path.normpath(config)}"] + argv
    if not given(argv, "--runner"):
        argv = ["--runner=DataflowRunner"] + argv  # never the DirectRunner on the launcher VM
    image = environ.get("IMAGE_TFRECORDS_WORKER_IMAGE")
    if image and not given(argv, "--sdk_container_image") and not given(argv, "--setup_file"):
        argv.append(f"--sdk_container_image={image}")
    return argv


if __name__ == "__main__":
    argv = launcher_argv(sys.argv[1:], os.environ)
    if not (given(argv, "--sdk_container_image") or given(argv, "--setup_file")):
        # (The launch body's environment.sdkContainerImage may still set it: warn only.)
        print("warning: no worker image (--sdk_container_image) and no --setup_file: unless "
              "the launch environment names the worker image, workers lack image-tfrecords. "
              "Build this launcher with --build-arg WORKER_IMAGE=<worker image>.",
              file=sys.stderr)
    console(argv)
