"""Shared fixtures. Fixtures for real servers live in their own modules, imported here."""
