"""The one reader of the config's keys (``gpushift/config/keys.py``): its error format names the file
and the key's line, and the ``[hooks]`` tables are read by the same reader as every other table."""

from __future__ import annotations

import pytest

from gpushift.config import hooks, reader, textfile
from gpushift.config.keys import KeyReader
from gpushift.errors import ConfigError

TEXT = '[daemon]\nbus = "system"\n\n[hooks]\nuser = "nobody"\nbefore_stop = { argv = ["/bin/true"], timeout_s = 0 }\n'


def test_key_reader_errors_name_the_file_and_the_line_of_the_key() -> None:
    r = KeyReader("/etc/gpushift/gpushift.toml", textfile.key_lines(TEXT))
    assert str(r.err("hooks.user", "bad")) == "/etc/gpushift/gpushift.toml:5: hooks.user: bad"
    assert str(r.err("hooks.after_ready", "bad")).startswith("/etc/gpushift/gpushift.toml:4: ")  # its table
    with pytest.raises(ConfigError, match=r"^x:1: t.n: expected a value <= 10, got 11$"):
        KeyReader("x").number({"n": 11}, "t", "n", 1, maximum=10)


def test_the_config_reader_is_a_key_reader_and_reads_the_hooks_tables() -> None:
    assert issubclass(reader._Reader, KeyReader)
    with pytest.raises(
        ConfigError, match=r"^c.toml:6: hooks.before_stop.timeout_s: expected a value >= 1, got 0$"
    ):
        hooks.read_hooks(KeyReader("c.toml", textfile.key_lines(TEXT)), textfile.parse_toml(TEXT, "c.toml"))
