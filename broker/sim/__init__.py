"""Discrete-event simulation on a virtual clock, driving the same controller as a live run."""
