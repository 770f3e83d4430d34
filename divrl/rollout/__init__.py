"""divrl.rollout."""
