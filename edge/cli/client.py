"""The blocking client's former import path: it is edge.transports.client now (shipped by no
build; packaging/build.py leaves it out)."""

from edge.cli.shared import UsageError
from edge.transports.client import BadReply, CallFailed, Client, Unreachable, decoder

__all__ = ["BadReply", "CallFailed", "Client", "Unreachable", "UsageError", "decoder"]
