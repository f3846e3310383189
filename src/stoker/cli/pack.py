"""``stoker pack``: pack an image folder or a file list into packed shards (being written)."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    parser = commands.add_parser("pack", help="pack an image folder or a file list into packed shards")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    print("stoker pack: not available yet")
    return 2
