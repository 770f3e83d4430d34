"""divrl.data."""
