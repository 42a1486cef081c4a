"""Loading and validating user input: inventory files and bags."""
