"""Flex Template entry point: the launcher runs this file with the template parameters.

The Dataflow launcher calls `python main.py --input=… --output=… [other parameters]` plus
its own pipeline options (--project, --region, --temp_location, --staging_location,
--template_location, --setup_file, …). This is the ordinary CLI: cheap checks, listing and
the unchanged-inputs fingerprint here, then the Beam job on Dataflow, whose last stage
commits and publishes (DESIGN §1). Exit 0 when a job was submitted or the dataset was
already up to date.
"""

import sys

from beam_pipeline.cli import console

if __name__ == "__main__":
    argv = sys.argv[1:]
    if not any(a == "--runner" or a.startswith("--runner=") for a in argv):
        argv = ["--runner=DataflowRunner"] + argv  # never the DirectRunner on the launcher VM
    console(argv)
