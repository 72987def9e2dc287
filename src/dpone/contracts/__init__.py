"""Documents dpone writes and reads, and their canonical JSON. Pure, no I/O."""
