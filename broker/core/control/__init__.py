"""The controller: a snapshot of the world plus the time in, actions (each with a cause) out."""
