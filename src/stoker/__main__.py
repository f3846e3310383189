"""``python -m stoker``: the ``stoker`` command."""

import sys

from stoker.cli import main

sys.exit(main())
