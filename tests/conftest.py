"""Shared test settings."""

import os

# The CLI turns JAX's persistent compilation cache on by default in the user's cache
# directory; tests must not write there (tests of the cache give their own directory).
os.environ.setdefault("CIRCLE_JAX_CACHE", "off")
