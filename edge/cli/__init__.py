"""The `qledge` command line: a thin client of the daemon's tool socket."""
