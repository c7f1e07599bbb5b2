"""``make bench``: zkbeat side by side with celery beat and celery-redbeat.

Run as ``python -m tests.bench [--quick]``. The modules here are never
collected by pytest (no ``test_*.py`` or ``*_test.py`` names): timings
belong in a benchmark on a quiet machine, not in pass/fail tests on a
shared one.
"""
