"""etcd metadata store for Icefloe: ``[metadata] backend = "etcd"``.

Importing this package imports no gRPC code; the adapter is loaded when the backend is opened.
"""
