"""Bundled data: the synthetic demo hospital CSV and the script that generates it."""
