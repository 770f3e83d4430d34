"""divrl.evaluation."""
