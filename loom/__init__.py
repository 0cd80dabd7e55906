"""Loom's command line and the composition root that wires services onto a bus."""
