"""The status page people open without a shell: ``summary`` (the one redacted summary the daemon
hands the front door, built from an allowlist of fields) and ``html`` (that summary as a page of
plain HTML with an inline SVG timeline of the week, and as ``status.json``)."""
