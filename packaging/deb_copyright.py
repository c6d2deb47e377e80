"""The package's /usr/share/doc/gpushift/copyright (Debian policy 12.5), written by ``make deb``.

Run with the staged virtualenv's Python, so that the Python distributions it bundles are the ones
listed: ``ROOT/opt/gpushift/bin/python packaging/deb_copyright.py LICENSE``.  Each one's licence
is read from its metadata (PEP 639's ``License-Expression``, else ``License``, else its
classifiers); the licence texts its authors ship stay in its ``.dist-info`` directory.
"""

from __future__ import annotations

import re
import sys
import textwrap
from importlib import metadata


def licence_of(dist: metadata.Distribution) -> str:
    meta = dist.metadata
    expression = meta["License-Expression"]
    if expression:
        return str(expression)
    text = meta["License"]
    if text and "\n" not in text.strip() and len(text) <= 60:
        return str(text).strip()
    classifiers = [
        c.rsplit(" :: ", 1)[-1] for c in meta.get_all("Classifier") or [] if c.startswith("License ::")
    ]
    return ", ".join(classifiers) or "see its .dist-info directory"


#: Licences whose text Debian keeps in /usr/share/common-licenses: a pattern of the names the
#: metadata uses, and the files.
COMMON = (
    (r"LGPL|Lesser General Public", 'LGPL-2.1 (LGPL-3 for "or later")'),
    (r"\bMPL-1\.1|Mozilla Public License 1\.1", "MPL-1.1"),
    (r"\bMPL-2\.0|Mozilla Public License 2\.0", "MPL-2.0"),
    (r"Apache", "Apache-2.0"),
    (r"(?<!L)GPL-?2|(?<!Lesser )General Public License v2", "GPL-2"),
    (r"(?<!L)GPL-?3|(?<!Lesser )General Public License v3", "GPL-3"),
)


def common_licences(named: str) -> list[str]:
    """Where the full text of each licence named that Debian ships is (policy 12.5)."""
    found = [
        f"    /usr/share/common-licenses/{path}" for pattern, path in COMMON if re.search(pattern, named)
    ]
    if not found:
        return []
    return ["The full texts of the licences above that Debian ships:", "", *found, ""]


def render(license_text: str) -> str:
    site = sorted(
        (str(d.metadata["Name"]), d.version, licence_of(d))
        for d in metadata.distributions()
        if str(d.metadata["Name"]).lower() != "gpushift"
    )
    where = f"/opt/gpushift/lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages"
    lines = [
        "gpushift: time-share one GPU host between inference servers.",
        "",
        "gpushift (the gpushift package of the virtualenv, its units, configuration, D-Bus policy,",
        "man page and completions):",
        "",
        textwrap.indent(license_text.strip(), "    "),
        "",
        f"The virtualenv bundles these Python distributions under {where},",
        "each under its own licence; the licence texts their authors ship are in each one's",
        ".dist-info directory there:",
        "",
        *(f"    {name} {version}: {licence}" for name, version, licence in site),
        "",
        *common_licences(" ".join(licence for _n, _v, licence in site)),
    ]
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: deb_copyright.py LICENSE", file=sys.stderr)
        return 2
    with open(sys.argv[1], encoding="utf-8") as f:
        sys.stdout.write(render(f.read()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
