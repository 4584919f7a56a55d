"""The release number: here so that every layer can read it without importing the package root."""

__version__ = "0.1.0"
