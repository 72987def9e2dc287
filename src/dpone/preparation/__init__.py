"""Preparation: a validated bulk text file turned into exact RowBinary, and its checks."""
