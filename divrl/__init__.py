"""divrl: reinforcement learning with verifiable rewards that keeps the model's diversity."""

__version__ = "0.1.0"
