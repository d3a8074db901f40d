"""``python -m fsobs.cli``: the ``fsobs`` command."""

import sys

from fsobs.cli import main

sys.exit(main())
