"""Developer tools for tqlab (not installed with the package)."""
