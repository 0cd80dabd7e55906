"""Plumbing shared by every service: effects, clocks, the virtual-time kernel, buses, shells."""
