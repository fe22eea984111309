"""Installable package; also Dataflow's --setup_file, so workers get the same code."""

import re

import setuptools

VERSION = re.search(r'__version__ = "(.+?)"', open("beam_pipeline/__init__.py").read()).group(1)

setuptools.setup(
    name="image-tfrecords",
    version=VERSION,
    description="Image files to sharded TFRecords with Apache Beam, and a tf.data reader",
    packages=setuptools.find_packages(include=["beam_pipeline", "beam_pipeline.*",
                                               "readers", "readers.*"]),
    python_requires=">=3.10",
    # Ranges here; the tested set is pinned in constraints.txt.
    install_requires=[
        "apache-beam[gcp]>=2.60,<3",
        "tensorflow>=2.16,<3",
        "tensorflow-transform>=1.16",
        "pillow>=10",
        "simplejpeg>=1.8",  # libjpeg-turbo: strict decode (corrupt data is an error), fast codec
        "pyyaml>=6",
    ],
    extras_require={
        # tensorflow-datasets only to prove TFDS reads our metadata (the writer doesn't need it)
        "test": ["pytest", "gcp-storage-emulator", "tfrecord", "psutil", "tensorflow-datasets",
                 "hypothesis"],
        # benchmarks/bench_near_duplicates.py: imagehash only as the yardstick the job's own
        # hash was measured against; the photos that scikit-image, scikit-learn and matplotlib
        # ship are its test images.
        "bench": ["imagehash", "scikit-image", "scikit-learn", "matplotlib", "psutil"],
    },
    entry_points={"console_scripts": [
        "image-tfrecords=beam_pipeline.cli:console",
        "image-tfrecords-verify=beam_pipeline.tools.verify:main",
        "image-tfrecords-inspect=beam_pipeline.tools.inspect_dataset:main",
    ]},
)
