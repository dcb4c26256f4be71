"""Icefloe object store on Google Cloud Storage: ``[object_store] backend = "gcs"``."""
