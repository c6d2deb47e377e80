"""Pre-warm: read the coming backend's model files into the page cache before its boundary.

``plan`` (pure: which files, within the memory budget), ``reader`` (the reader process, idle I/O and a
rate cap), ``consumer`` (the look-ahead consumer that starts and ends the reader)."""
