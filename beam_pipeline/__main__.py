import sys

from beam_pipeline.cli import main

sys.exit(main())
