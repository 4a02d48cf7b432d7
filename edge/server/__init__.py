"""The Unix-socket tool server."""
