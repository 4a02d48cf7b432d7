"""Domain types, ports and errors. No I/O lives here."""
