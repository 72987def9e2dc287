"""Codecs and transports: bulk text, RowBinary, HTTP, client process."""
