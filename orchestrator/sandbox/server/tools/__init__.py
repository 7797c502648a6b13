"""Tools served by the in-sandbox execution server (standard library only)."""
