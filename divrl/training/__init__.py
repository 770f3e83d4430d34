"""divrl.training."""
