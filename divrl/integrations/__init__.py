"""divrl.integrations."""
