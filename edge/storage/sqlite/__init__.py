"""SQLite adapters on one apsw connection that lives in apsw's async worker thread."""
