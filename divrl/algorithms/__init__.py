"""divrl.algorithms."""
