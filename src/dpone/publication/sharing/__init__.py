"""What the tables of one run share: one read answering the calls its tables make at once.

See docs/publication.md ("Many tables in one run").
"""
