"""``stoker doctor``: run the data pipeline self-checks over a dataset (being written)."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    parser = commands.add_parser("doctor", help="run the data pipeline self-checks over a dataset")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    print("stoker doctor: not available yet")
    return 2
