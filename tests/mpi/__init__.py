"""Tests run under mpiexec (a package, so that its conftest never shadows tests/conftest.py)."""
