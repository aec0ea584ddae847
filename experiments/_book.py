"""What the book says, shared by the experiments' report hooks: Dive into Deep Learning,
chapter 13 (Computational Performance), its PyTorch edition. Only what we are sure of: its
printed *timings* for 13.1, 13.2, 13.5 and 13.6 come out of the book's own build, differ between
its editions and name no machine, so none are quoted (no number we cannot vouch for)."""

REFERENCE = "the book"
SETUP_ONLY = (
    "The book's printed timings for this section are not quoted: they come out of its own build, "
    "differ between its editions, and name no machine. Its setup is, beside this tree's."
)
