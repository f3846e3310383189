"""Tests of stoker.formats; damage.py holds the ways the integrity tests corrupt files."""
