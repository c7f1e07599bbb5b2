"""What the tests share: servers, real beat replicas, faults, the accounting.

Nothing here is collected by pytest (no ``test_*.py`` names); ``tests/``
itself holds only ``conftest.py`` and the test modules.
"""
