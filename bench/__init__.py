"""``make bench``: zkbeat side by side with celery beat and celery-redbeat.

Run as ``python -m bench [--quick]``. A program beside ``demo/``, not a
test helper: it lives outside ``tests/`` so pytest never collects it, because
timings belong in a benchmark on a quiet machine, not in pass/fail tests on a
shared one. It borrows the servers and the process launcher of
``tests.support``.
"""
