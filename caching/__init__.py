"""caching package."""
