"""Changing the embedding model without stopping search (the column swap) and the quality gate on a switch.

May import every layer below it, memctl.observe included (a switch reports the new model's size).
"""
