"""Entry point: `python -m harness.engine --model-path embedded:small [flags]` (see `--help`)."""

import sys

from harness.engine.server import main

sys.exit(main())
