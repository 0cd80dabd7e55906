"""Plumbing shared by every service: effects, clocks, the virtual-time kernel, buses, shells."""

from domain.compiled import extend

extend(__path__, __name__)
