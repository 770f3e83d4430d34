"""divrl.rewards."""
