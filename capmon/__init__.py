"""capmon: keep LLM API work running when models are at capacity."""

__version__ = "0.1.0"
