"""Tests of stoker.doctor; synthetic.py holds the datasets they diagnose."""
