"""The pure decision core: no clock, no I/O, no cloud or SSH calls.

Everything here takes ``now`` (seconds on the run's clock), ids and random generators as
inputs, so the live daemon, the dry-run and the simulator drive the very same rules.
"""
