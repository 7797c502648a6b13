"""Apptainer definition templates (images/*.def.j2), cache keys, and the image builder."""
