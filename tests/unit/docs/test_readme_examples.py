"""The README's minimal config and schedule are what a newcomer copies first: both parse as they
stand, and the schedule names only the config's backends."""

from __future__ import annotations

import re
from pathlib import Path

from gpushift.config.schema import parse as parse_config
from gpushift.schedule import parse_schedule

README = (Path(__file__).resolve().parents[3] / "README.md").read_text(encoding="utf-8")


def block(after_heading: str, fence: str) -> str:
    """The first fenced block of kind ``fence`` in the README section ``after_heading``."""
    section = README.split(f"## {after_heading}\n", 1)[1].split("\n## ", 1)[0]
    found = [
        body for info, body in re.findall(r"^```(\w*)\n(.*?)^```", section, re.S | re.M) if info == fence
    ]
    assert found, f"no ```{fence} block under '## {after_heading}' in README.md"
    return found[0]


def test_readme_minimal_config_and_schedule_parse_and_agree() -> None:
    cfg = parse_config(block("A minimal config", "toml"), "README.md")
    assert set(cfg.backends) == {"vllm", "llama"}
    sched = parse_schedule(block("A minimal config", ""), "README.md", backends=cfg.backends)
    assert {e.target for e in sched.entries} == {"vllm", "llama"}
