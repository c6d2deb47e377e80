"""Test and demo machinery, kept out of the installed package.

``sandbox``: a private systemd user manager and D-Bus session bus.  ``standin``: the stand-in HTTP
backend that tests and the demo run as systemd units.  ``demo``: the driver of ``make demo``.
They are imported as ``tests.support.*`` from the repository root (pytest puts it on ``sys.path``;
``make demo`` runs from it).
"""
