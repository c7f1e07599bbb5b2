"""Schedulers for schedule stores other than ``beat_schedule``; each imports its framework only when loaded."""
