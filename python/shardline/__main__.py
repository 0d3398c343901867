"""``python -m shardline``: the ``shardline`` command."""

import sys

from shardline.cli import main

sys.exit(main())
