"""The files people write about the daemon, read and typed: the config file (every key with its range,
``docs/config.md``), its ``[hooks]`` and ``[notify]`` tables, the rules for names and one-line texts,
and the one reader of a file a person wrote (regular file, bounded, UTF-8, errors by line)."""
