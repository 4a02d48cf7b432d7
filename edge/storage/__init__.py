"""Storage adapters implementing the ports of edge.core."""
