"""A dispatch's arrays as the hot path sees them (C functions only: nothing here is called from Python)."""
