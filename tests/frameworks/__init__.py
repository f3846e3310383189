"""Tests with training frameworks (accelerate, Lightning, Hugging Face datasets)."""
