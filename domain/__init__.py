"""Loom's shared domain models: what a job costs and how fast it runs where, shared by the
policies, the trace readers and every service. Imports only `schemas` and numerical
libraries (the layers are in pyproject.toml, [tool.importlinter])."""

from domain.compiled import extend

extend(__path__, __name__)  # the compiled modules ahead of their source, if built
