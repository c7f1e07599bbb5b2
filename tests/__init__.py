"""Test suite for zkbeat; a package so ``from tests.support.helpers import ...`` works."""
