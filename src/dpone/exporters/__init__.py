"""The producer side: read a source table, write a bulk text file and its receipt."""
