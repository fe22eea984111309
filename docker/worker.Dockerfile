# Dataflow (or Flink/Spark portable) worker image for image-tfrecords: the production path.
#
# Base: the Apache Beam Python SDK container of the pinned Beam version (constraints.txt:
# apache-beam==2.77.0) and Python minor version (launch from Python 3.11 too). It keeps the
# base image's entrypoint (/opt/apache/beam/boot), which Dataflow starts as the SDK harness.
# The package and its dependencies, pinned by constraints.txt, are installed here at build
# time, so a worker VM installs nothing when it starts: submit with --sdk_container_image
# and without --setup_file, and workers need no PyPI (no public IP, no Cloud NAT).
#
# The build needs no index either: every pip install here takes its wheels from the
# wheelhouse that docker/build_wheelhouse.py makes from constraints.txt (build/wheelhouse,
# mounted for the install only, so no wheel stays in a layer; BuildKit, Docker's default
# builder since 23.0). Pin the base by digest as well where your registry policy asks:
#   docker buildx imagetools inspect apache/beam_python3.11_sdk:2.77.0   # "Digest: sha256:…"
# then FROM apache/beam_python3.11_sdk:2.77.0@sha256:… (docs/dataflow.md).
#
# No TensorFlow by default: the job never imports it. For --transform, build a wheelhouse
# and a second image with the extra (and launch from an environment that has it too):
#   python docker/build_wheelhouse.py --extras transform
#   docker build -f docker/worker.Dockerfile --build-arg EXTRAS=transform -t …-transform .
#
# Build from the repository root (BuildKit sends only the files COPY and the mount name):
#   python docker/build_wheelhouse.py
#   WORKER=us-central1-docker.pkg.dev/PROJECT/dataflow/image-tfrecords-worker:$(python docker/image_tag.py)
#   docker build -f docker/worker.Dockerfile -t $WORKER . && docker push $WORKER
# Then submit with --sdk_container_image=$WORKER (docs/dataflow.md): a tag derived from the
# code and constraints (docker/image_tag.py), or the pushed digest, never a reused tag.
FROM apache/beam_python3.11_sdk:2.77.0

ARG EXTRAS=""
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TF_CPP_MIN_LOG_LEVEL=2

WORKDIR /opt/image-tfrecords

# 1. The pinned pip and setuptools, then the dependencies only, pinned by constraints.txt
#    (the set the tests ran with), all from the wheelhouse. This layer changes only when
#    setup.py, constraints.txt or the wheelhouse do, so code edits rebuild in seconds.
#    (setup.py reads the version from beam_pipeline/__init__.py, so that file comes along;
#    the pinned setuptools builds it: --no-build-isolation, nothing fetched.)
COPY constraints.txt setup.py docker/check_pins.py ./
COPY beam_pipeline/__init__.py beam_pipeline/__init__.py
RUN --mount=type=bind,source=build/wheelhouse,target=/wheelhouse \
    pip install --no-index --find-links /wheelhouse -c constraints.txt pip setuptools \
    && pip install --no-index --find-links /wheelhouse --no-build-isolation \
       -c constraints.txt ".${EXTRAS:+[$EXTRAS]}" \
    && pip uninstall -y image-tfrecords

# 2. The package itself, without touching the dependencies installed above. Then prove the
#    image is the tested stack: every installed requirement of the package equals its pin,
#    and the job imports without TensorFlow.
COPY beam_pipeline/ beam_pipeline/
COPY dataset_format/ dataset_format/
COPY tf_quiet/ tf_quiet/
COPY readers/ readers/
COPY loaders/ loaders/
RUN pip install --no-index --no-deps --no-build-isolation . \
    && python check_pins.py constraints.txt "image-tfrecords${EXTRAS:+[$EXTRAS]}" pip setuptools \
    && python -c "import sys, beam_pipeline.cli, beam_pipeline.job.pipeline, dataset_format.layout; \
assert sys.modules['apache_beam'].__version__ == '2.77.0'; \
assert '${EXTRAS}' or 'tensorflow' not in sys.modules, 'the job imported TensorFlow'"
