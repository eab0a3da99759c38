"""video package."""
