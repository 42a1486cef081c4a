"""Hybrid-cloud execution broker for bags of independent tasks."""

__version__ = "0.1.0"
