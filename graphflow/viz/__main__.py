"""`python -m graphflow.viz MODEL ...`: graphflow visualize without the cli entry point."""

import sys

from graphflow.viz.command import main

sys.exit(main())
