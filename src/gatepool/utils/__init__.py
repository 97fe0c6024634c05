"""Plumbing shared by every part: atomic file writes and JSON (``io``), the machine description
(``environment``)."""
