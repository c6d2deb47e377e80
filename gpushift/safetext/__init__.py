"""Text shown to people: secrets hidden (``redact``) and text from outside escaped for a terminal
(``terminal``).  Every line printed, logged or recorded goes through here."""
