"""Staging: a prepared file sent into a private, verified table, with its attempt journal."""
