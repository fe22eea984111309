"""Installable package: the worker image installs it with its pinned dependencies.

The base install is what the launcher and the Beam workers need: no TensorFlow. Extras:
  reader     TensorFlow, for readers/ (training side) and the verify / inspect tools
  transform  TensorFlow and tensorflow-transform, for --transform (launcher and workers)
  test       everything the test suite uses (it covers the reader and --transform too)
"""

import re

import setuptools

VERSION = re.search(r'__version__ = "(.+?)"', open("beam_pipeline/__init__.py").read()).group(1)

TENSORFLOW = ["tensorflow>=2.16,<3"]
TRANSFORM = TENSORFLOW + ["tensorflow-transform>=1.16"]

setuptools.setup(
    name="image-tfrecords",
    version=VERSION,
    description="Image files to sharded TFRecords with Apache Beam, and a tf.data reader",
    packages=setuptools.find_packages(include=["beam_pipeline", "beam_pipeline.*", "dataset_format",
                                               "tf_quiet", "readers", "readers.*", "loaders",
                                               "loaders.*"]),
    python_requires=">=3.10",
    # Ranges here; the tested set is pinned in constraints.txt.
    install_requires=[
        "apache-beam[gcp]>=2.60,<3",
        "numpy>=1.24",
        "pyarrow>=14",
        "google-crc32c>=1.5",
        "pillow>=10",
        "simplejpeg>=1.8",  # libjpeg-turbo: strict decode (corrupt data is an error), fast codec
        "pyyaml>=6",
    ],
    extras_require={
        "reader": TENSORFLOW,
        "transform": TRANSFORM,
        # tensorflow-datasets only to prove TFDS reads our metadata (the writer doesn't need it);
        # imagehash only to prove the job's own pHash gives the library's bits; torch (the CPU
        # build constraints.txt pins) and grain to run the TensorFlow-free loaders in the real
        # PyTorch DataLoader and Grain; pytest-xdist runs the suite on two processes
        "test": TRANSFORM + ["pytest", "pytest-xdist", "gcp-storage-emulator", "tfrecord",
                             "psutil", "tensorflow-datasets", "hypothesis", "imagehash",
                             "torch>=2.4,<3", "grain>=0.2.10"],
        # benchmarks/bench_near_duplicates.py: imagehash only as the yardstick the job's own
        # hash was measured against; the photos that scikit-image, scikit-learn and matplotlib
        # ship are its test images. (TensorFlow: the reader and transform benchmarks.)
        "bench": TRANSFORM + ["imagehash", "scikit-image", "scikit-learn", "matplotlib",
                              "psutil"],
    },
    entry_points={"console_scripts": [
        "image-tfrecords=beam_pipeline.cli:console",
        "image-tfrecords-verify=beam_pipeline.tools.verify:main",
        "image-tfrecords-inspect=beam_pipeline.tools.inspect_dataset:main",
    ]},
)
