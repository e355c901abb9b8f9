"""Agents the test suite's child processes drive (listed in tests/settings.py AGENTS)."""
