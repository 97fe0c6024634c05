"""Plumbing shared by every part: atomic file writes and JSON (``io``), the machine description
(``environment``), torch's thread count for a block (``threads``) and PNG figures (``plotting``)."""
