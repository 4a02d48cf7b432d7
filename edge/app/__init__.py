"""Composition: configuration, start-up and shutdown order of the daemon."""
