"""Shells: everything that touches the outside world (EC2, SSH, journal, logs, clock)."""
