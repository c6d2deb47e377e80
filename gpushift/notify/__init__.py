"""Telling people: the webhook (documents queued as files, delivered in order off the switch's path)
and the notices sent ahead of a switch (the webhook's notice, the ``before_boundary`` hook)."""
