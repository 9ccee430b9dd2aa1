"""Preference optimisation: offline DPO / IPO / cDPO / KTO and iterative (online) DPO."""
