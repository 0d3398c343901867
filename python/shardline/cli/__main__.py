"""``python -m shardline.cli``: the ``shardline`` command."""

import sys

from shardline.cli import main

sys.exit(main())
