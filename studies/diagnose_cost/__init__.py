"""What a diagnosis costs: `python -m diagnose` on a paper-width, 28-layer checkpoint (measure.py)."""
