"""Tests of stoker.cli: the stoker command and its subcommands."""
