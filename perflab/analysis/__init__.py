"""What rows mean: statistics, verdicts, the book's claims, row frames, plots and tables."""
