"""The status page people open without a shell: ``summary`` (the one redacted summary the daemon
hands the front door, built from an allowlist of fields), ``page`` (that summary as a page of plain
HTML, and as ``status.json``) and ``timeline`` (the week in it as an inline SVG)."""
