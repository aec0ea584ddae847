"""An example package of your own, measured with perflab: see docs/bring-your-own.md."""
