"""Rows on disk: the row format and its column vocabulary, run dirs, the results tree and its index."""
