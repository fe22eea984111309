# Custom Dataflow (or Flink/Spark portable) worker for image-tfrecords.
#
# Base: the Apache Beam Python SDK container of the pinned Beam version (constraints.txt:
# apache-beam==2.77.0) and Python minor version (launch from Python 3.11 too). It keeps the
# base image's entrypoint (/opt/apache/beam/boot), which Dataflow starts as the SDK harness.
# The project's dependencies (TensorFlow, tensorflow-transform, Pillow, …) are installed here
# once, so workers do not pip-install ~2 GB each time a VM starts.
#
# Build from the repository root (BuildKit sends only the files COPY names):
#   docker build -f docker/worker.Dockerfile \
#     -t us-central1-docker.pkg.dev/PROJECT/dataflow/image-tfrecords-worker:2.77.0 .
#   docker push us-central1-docker.pkg.dev/PROJECT/dataflow/image-tfrecords-worker:2.77.0
# Then submit with --sdk_container_image=<that tag> (docs/dataflow.md).
FROM apache/beam_python3.11_sdk:2.77.0

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TF_CPP_MIN_LOG_LEVEL=2

WORKDIR /opt/image-tfrecords

# 1. Dependencies only, from setup.py's install_requires pinned by constraints.txt. This layer
#    changes only when setup.py or constraints.txt do, so code edits rebuild in seconds.
#    (setup.py reads the version from beam_pipeline/__init__.py, so that file comes along.)
COPY constraints.txt setup.py ./
COPY beam_pipeline/__init__.py beam_pipeline/__init__.py
RUN pip install -c constraints.txt . \
    && pip uninstall -y image-tfrecords \
    && python -c "import apache_beam, tensorflow, PIL, yaml; \
assert apache_beam.__version__ == '2.77.0', apache_beam.__version__"

# 2. The code itself, without touching the dependencies installed above. Jobs submitted
#    with --setup_file as well install their sdist on top of this (fast: deps are satisfied).
COPY beam_pipeline/ beam_pipeline/
COPY readers/ readers/
RUN pip install --no-deps . \
    && python -c "import beam_pipeline.job.shards, readers.layout"
