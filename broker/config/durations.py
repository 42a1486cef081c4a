"""Compatibility name: durations live in the pure core's units module, ``broker.core.units``."""

from broker.core.units import format_duration, parse_duration

__all__ = ["format_duration", "parse_duration"]
