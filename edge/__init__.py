"""qledge: a minimal-footprint task runtime for routers and small boards."""

__version__ = "0.1.0"
