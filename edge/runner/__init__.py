"""Running tasks as subprocesses: process groups, timeouts, bounded logs."""
