"""Preference optimisation: DPO, IPO, cDPO and KTO against a frozen reference (losses.py: the math; stage.py: the stage)."""
