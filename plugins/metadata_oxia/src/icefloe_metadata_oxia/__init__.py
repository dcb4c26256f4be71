"""Oxia metadata store for Icefloe: ``[metadata] backend = "oxia"``.

Importing this package imports no gRPC code; the adapter is loaded when the backend is opened.
"""
