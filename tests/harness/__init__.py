"""Shared checks for the hard properties (see save_load for the resume round trip)."""
