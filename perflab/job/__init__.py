"""One job's way from its config to its rows and record, and a sweep's summary."""
