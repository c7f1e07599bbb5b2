"""Test suite for zkbeat; a package so ``from tests.helpers import ...`` works."""
