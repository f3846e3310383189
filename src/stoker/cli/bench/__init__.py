"""``stoker bench``: sweep ``num_workers`` (and ``prefetch_factor``) over a dataset, find the knee.

``command.py`` holds the arguments and the run; ``report.py`` draws the result: a table,
the knee in one line, a PNG plot (matplotlib, from the ``cli`` extra) and, if asked, a
self-contained HTML report or JSON. The measuring is :func:`stoker.tuning.sweep`.
"""

from __future__ import annotations

from stoker.cli.bench.command import add_parser, run
from stoker.cli.bench.report import format_table

__all__ = ["add_parser", "format_table", "run"]
