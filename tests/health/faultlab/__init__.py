"""The fault-injection lab of issue 27 (item 5): simulated GPU nodes with the real agent and repair controller."""
