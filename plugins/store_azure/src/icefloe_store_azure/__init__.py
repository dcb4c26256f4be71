"""Icefloe object store on Azure Blob Storage: ``[object_store] backend = "azure"``."""
