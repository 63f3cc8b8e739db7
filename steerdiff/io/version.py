"""The package version, in one place (read by the package metadata and written into every saved checkpoint)."""

__version__ = "0.1.0"
